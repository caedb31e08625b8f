package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/spool"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workerclient"
)

// streamDrainTimeout bounds how long a finished run waits for its output
// consumers (a variable so tests can shorten it).
var streamDrainTimeout = 2 * time.Minute

// outputHook is the run's output: its spools, their consumers and logs.
//
//	Prestart   the stdout and stderr spools are created; the container
//	           writes to them (their host copies count against the run's
//	           record budget)
//	Poststart  the consumers follow the spools (followers)
//	Exited     the spools close; the consumers deliver the tail, within
//	           streamDrainTimeout and the shutdown grace; what was over
//	           the cap, and a failed agent's read-only root hint
//	Collect    the output and stderr logs are stored, and the head of the
//	           output kept for the result (also from a kept run's copy)
//	Stop       the spools are closed, if Exited did not
type outputHook struct {
	p              *plan
	stdout, stderr *spool.Spool
	followers      *followers
	// stdoutFrom and stderrFrom are where a restored run's output goes on
	// (goOn): the live copies start there.
	stdoutFrom, stderrFrom int64
}

func (h *outputHook) name() string { return "output" }

func (h *outputHook) prestart(ctx context.Context, req *prestartRequest, resp *prestartResponse) error {
	p := h.p
	limit, budget := spool.WithLimit(p.limits.maxOutput), spool.WithBudget(req.Records)
	stdout, err := spool.New(filepath.Join(p.hostDir, stdoutSpoolName), limit, budget)
	if err != nil {
		return fmt.Errorf("stdout spool: %w", err)
	}
	h.stdout = stdout
	stderr, err := spool.New(filepath.Join(p.hostDir, stderrSpoolName), limit, budget)
	if err != nil {
		return fmt.Errorf("stderr spool: %w", err)
	}
	h.stderr = stderr
	resp.Stdout, resp.Stderr = stdout, stderr
	if rs := p.in.restore; rs != nil && (!rs.fork || rs.manifest.Kind == sandbox.CheckpointMemory) {
		// A fork from files starts its command afresh: its log too.
		return h.goOn(ctx)
	}
	return nil
}

// goOn starts a restored run's spools with the logs stored when it
// paused, so that its output goes on from where it stopped: the stored
// logs end whole, and the live copies get only what follows.
func (h *outputHook) goOn(ctx context.Context) error {
	p := h.p
	for _, l := range []struct {
		s      *spool.Spool
		object string
		from   *int64
	}{{h.stdout, OutputLogName, &h.stdoutFrom}, {h.stderr, StderrLogName, &h.stderrFrom}} {
		rc, err := p.in.Persist.OpenRunFile(ctx, p.ref.WithRun(p.in.restore.from), l.object)
		if errors.Is(err, persist.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("fetch the %s of the paused run: %w", l.object, err)
		}
		n, err := io.Copy(l.s, rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("fetch the %s of the paused run: %w", l.object, err)
		}
		if !p.in.restore.fork {
			// A fork is a run of its own: its stream and live copies
			// start with the parent's output before the checkpoint.
			*l.from = n
		}
	}
	if p.in.restore.fork {
		return nil
	}
	if want := p.in.restore.manifest.StdoutOffset; want != h.stdoutFrom {
		p.log.Warn("the stored output log of the paused run is not as long as its checkpoint says", "stored_bytes", h.stdoutFrom, "checkpoint_offset", want)
	}
	return nil
}

func (h *outputHook) poststart(_ context.Context, req *poststartRequest) {
	h.followers = follow(req.Hard, h.p, h.stdout, h.stderr, h.stdoutFrom, h.stderrFrom)
}

func (h *outputHook) exited(_ context.Context, req *exitedRequest, resp *exitedResponse) error {
	p := h.p
	if h.stderr == nil {
		return nil
	}
	if req.Result.ExitCode > 0 {
		resp.ReadOnlyRootWrite = mentionsReadOnlyFS(h.stderr.Path(), h.stderr.Size())
	}
	// Wait drained the container's streams; closing the spools lets the
	// consumers deliver the tail and finish.
	h.stop(context.Background(), nil)
	if h.followers != nil {
		stopDrain := p.timings.Start(timings.Drain)
		followErr := h.followers.wait()
		resp.StreamEnded = h.followers.streamEnded.Load()
		stopDrain()
		if followErr != nil {
			p.log.Warn("stream output", "err", followErr)
		}
	}
	if resp.DroppedOutputBytes = h.stdout.Dropped() + h.stderr.Dropped(); resp.DroppedOutputBytes > 0 {
		p.log.Warn("output over the cap was dropped", "cap_bytes", p.limits.maxOutput, "dropped_bytes", resp.DroppedOutputBytes)
	}
	return nil
}

// collect stores both logs and keeps the head of the stdout log.
func (h *outputHook) collect(ctx context.Context, req *collectRequest, resp *collectResponse) error {
	head, err := readHead(filepath.Join(h.p.hostDir, stdoutSpoolName), MaxResultOutputBytes)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	resp.Output = head
	var errs []error
	for _, l := range []struct{ spool, object string }{{stdoutSpoolName, OutputLogName}, {stderrSpoolName, StderrLogName}} {
		if err := req.Kept(ctx, l.spool, l.object, "text/plain; charset=utf-8"); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", l.object, err))
		}
	}
	return errors.Join(errs...)
}

// stop closes the spools (closing twice is harmless).
func (h *outputHook) stop(context.Context, *stopRequest) {
	for _, s := range []*spool.Spool{h.stdout, h.stderr} {
		if s != nil {
			s.Close()
		}
	}
}

// erofsTail is how much of the end of a failed run's stderr is searched
// for a read-only filesystem error.
const erofsTail = 64 << 10

// mentionsReadOnlyFS reports whether the last erofsTail bytes of the stderr
// spool at path (size bytes long) hold the text of EROFS as libc, Go,
// Python and Node print it. It is only a hint for the run's reason: the
// agent controls that text, and at worst misleads about itself.
func mentionsReadOnlyFS(path string, size int64) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	off := max(size-erofsTail, 0)
	buf := make([]byte, erofsTail)
	n, _ := f.ReadAt(buf, off)
	tail := bytes.ToLower(buf[:n])
	return bytes.Contains(tail, []byte("read-only file system")) || bytes.Contains(tail, []byte("erofs"))
}

// followers deliver the spooled output to its consumers: the stream sender
// and the live stdout and stderr copies.
type followers struct {
	done   chan error
	n      int
	ctx    context.Context
	cancel context.CancelFunc
	// streamEnded is set when the stream sender's pump ended the stream.
	streamEnded atomic.Bool
}

// follow starts one goroutine per consumer. Each reads the spool from disk on
// its own, so a slow or stalled consumer never blocks the container or the
// other consumers. They run on hard, the run's shutdown context, which a
// cancellation of the run does not end: the container's last output
// (written during its stop grace) is still delivered, within
// streamDrainTimeout, but never past the run's shutdown grace.
func follow(hard context.Context, p *plan, stdout, stderr *spool.Spool, stdoutFrom, stderrFrom int64) *followers {
	ctx, cancel := context.WithCancel(hard)
	f := &followers{done: make(chan error, 3), ctx: ctx, cancel: cancel}
	start := func(s *spool.Spool, from int64, consume func(io.Reader) error) {
		f.n++
		go func() {
			rd := s.NewReaderContext(ctx, from)
			defer rd.Close()
			f.done <- consume(rd)
		}()
	}
	if sender := p.in.StreamSender; sender != nil {
		// A resumed run's stream goes on where it paused: the control
		// plane holds the bytes before.
		start(stdout, stdoutFrom, func(rd io.Reader) error {
			_, err := workerclient.Pump(ctx, rd, p.ref.RunID, sender, workerclient.PumpOptions{StartOffset: stdoutFrom})
			f.streamEnded.Store(err == nil)
			return err
		})
	}
	for _, c := range []struct {
		w    io.Writer
		s    *spool.Spool
		from int64
	}{{p.in.Stdout, stdout, stdoutFrom}, {p.in.Stderr, stderr, stderrFrom}} {
		if c.w != nil {
			start(c.s, c.from, func(rd io.Reader) error {
				_, err := io.Copy(c.w, rd)
				return err
			})
		}
	}
	return f
}

// wait waits for the followers to deliver everything, bounded so a dead
// control plane or a blocked writer cannot hold the run: past
// streamDrainTimeout, or once the run's shutdown grace is over, they are
// cancelled and left to finish on their own (undelivered bytes remain in
// the persisted output log; done is buffered, so no follower blocks on
// reporting).
func (f *followers) wait() error {
	timer := time.NewTimer(streamDrainTimeout)
	defer timer.Stop()
	var errs []error
	for range f.n {
		select {
		case err := <-f.done:
			errs = append(errs, err)
		case <-timer.C:
			f.cancel()
			return errors.Join(append(errs, errors.New("output consumers did not finish in time; the output log holds everything"))...)
		case <-f.ctx.Done():
			return errors.Join(append(errs, fmt.Errorf("output consumers stopped by the shutdown grace; the output log holds everything: %w", context.Cause(f.ctx)))...)
		}
	}
	f.cancel()
	return errors.Join(errs...)
}
