package taskrun

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

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/spool"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workerclient"
)

// streamDrainTimeout bounds how long a finished run waits for its output
// consumers (a variable so tests can shorten it).
var streamDrainTimeout = 2 * time.Minute

// execution is what supervise observed: the container, how it ended and
// what it cost. It is also kept on disk (run.json) for RetryPersist, hence
// the JSON names.
type execution struct {
	// ContainerID is the container that ran the agent; empty when none ran.
	ContainerID string `json:"container_id,omitempty"`
	// Runtime and ImageDigest describe the container as inspected.
	Runtime     string `json:"runtime,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	// Exit is the container's result.
	Exit sandbox.Result `json:"exit"`
	// PromptTokens and CompletionTokens are the gateway's metering; nil
	// when the run had no model.
	PromptTokens     *int `json:"prompt_tokens,omitempty"`
	CompletionTokens *int `json:"completion_tokens,omitempty"`
	// ModelUpstream says the model upstream was misconfigured or down at the
	// run's last model request (e.g. "model upstream answered 401
	// Unauthorized"); empty when it answered.
	ModelUpstream string `json:"model_upstream,omitempty"`
	// DroppedOutputBytes counts output past the cap, drained but not kept.
	DroppedOutputBytes int64 `json:"dropped_output_bytes,omitempty"`
	// DroppedRecordBytes counts bytes of host-side records (spools, trace
	// lines, gateway record) refused by the run's record budget.
	DroppedRecordBytes int64 `json:"dropped_record_bytes,omitempty"`
	// ReadOnlyRootWrite is set when the agent failed and the end of its
	// stderr reports a write refused by the read-only root filesystem:
	// the image expects to write outside /taskrun and /tmp.
	ReadOnlyRootWrite bool `json:"read_only_root_write,omitempty"`
	// StreamEnded is set once the control plane acknowledged the whole
	// stdout stream and its end; finishStream delivers it otherwise.
	StreamEnded bool `json:"stream_ended,omitempty"`
	// record is the isolation record (audit.json); nil when no container
	// was inspected.
	record []byte
	// removed is closed once the container is removed; nil when none was
	// started.
	removed <-chan struct{}
}

// awaitRemoved waits until the run's container is gone.
func (ex execution) awaitRemoved() {
	if ex.removed != nil {
		<-ex.removed
	}
}

// lifecycle is how supervise has the runner call the hooks of the
// container's events.
type lifecycle interface {
	// poststart runs the Poststart hooks once the container started.
	poststart(ctx context.Context, req *poststartRequest)
	// exited runs the Exited hooks, once.
	exited(ctx context.Context, res sandbox.Result) (*exitedResponse, error)
}

// apply takes what the Exited hooks reported.
func (ex *execution) apply(resp *exitedResponse) {
	ex.PromptTokens, ex.CompletionTokens, ex.ModelUpstream = resp.PromptTokens, resp.CompletionTokens, resp.ModelUpstream
}

// supervise runs the container l: the output spools, the self-check and
// the live audit, the streams to the consumers and the disk watchdog, all for exactly as long as the container lives. The returned
// error is the run's failure, if any; the execution is filled as far as the
// run got. hard is the run's shutdown context (shutdownContext): the output
// consumers outlive ctx's cancellation, but not hard.
func supervise(ctx, hard context.Context, tr *tracer, l *launch, hooks lifecycle) (ex execution, err error) {
	p, wd := tr.p, tr.wd
	// The spools' host copies count against the run's record budget.
	limit, budget := spool.WithLimit(p.limits.maxOutput), spool.WithBudget(wd.records)
	stdout, err := spool.New(filepath.Join(p.hostDir, stdoutSpoolName), limit, budget)
	if err != nil {
		return ex, fmt.Errorf("stdout spool: %w", err)
	}
	defer stdout.Close()
	stderr, err := spool.New(filepath.Join(p.hostDir, stderrSpoolName), limit, budget)
	if err != nil {
		return ex, fmt.Errorf("stderr spool: %w", err)
	}
	defer stderr.Close()

	iso := l.iso
	// The engine's host facts, which the live audit needs, are read while
	// the container starts.
	hostFacts := prefetchHostFacts(ctx, p.in.Sandbox, p.caps, l.created)
	var stderrSink io.Writer = stderr
	if len(p.helpers) > 0 {
		if err := iso.listenHold(p, wd.owner.UID); err != nil {
			return ex, fmt.Errorf("self-check: %w", err)
		}
		defer iso.closeHold()
		stderrSink = iso.intercept(stderr)
	}
	// The backend splits its Start into create, attach and start through
	// the context; the first stdout byte and the self-check's report (the
	// first stderr line) are timed from the start request.
	launched := p.timings.Now()
	streams := sandbox.Streams{Stdout: p.timings.FirstWrite(stdout, timings.FirstByte, launched), Stderr: stderrSink}
	if iso.interceptor != nil {
		streams.Stderr = p.timings.FirstWrite(stderrSink, timings.SelfCheck, launched)
	}
	h, err := l.start(timings.NewContext(ctx, p.timings), p, streams)
	p.timings.Since(timings.Launch, launched)
	if err != nil {
		return ex, fmt.Errorf("start sandbox: %w", err)
	}
	// The container is removed in the background once the run is over, while
	// its outputs are collected; Execute waits for it before the run's uid
	// and directory are released.
	defer func() { ex.removed = removeContainer(ctx, p, h) }()
	ex.ContainerID, ex.Runtime, ex.ImageDigest = h.ID(), p.policy.Runtime, p.image.Digest()
	p.log.Info("container started", "container", h.ID(), "image", l.spec.Image, "runtime", p.policy.Runtime)

	// The live audit runs while the container starts; the self-check holds
	// the agent until it passed. A container that is not confined as asked
	// is stopped at once and its agent never runs. RUNNING is reported once
	// the agent was let go.
	waitCtx, stop := context.WithCancel(ctx)
	defer stop()
	audited := make(chan error, 1)
	go func() {
		err := p.timings.Time(timings.LiveAudit, func() error { return iso.auditLive(ctx, p.caps, h, hostFacts) })
		if err != nil {
			iso.closeHold()
			stop()
		} else if iso.releaseHold(waitCtx) {
			running := ex
			if iso.posture != nil {
				running.ImageDigest, running.Runtime = imageDigest(p.image, iso.posture.Image), iso.posture.Runtime
			}
			tr.trace(ctx, transition{state: stateRunning, ex: &running})
		}
		audited <- err
	}()
	tr.trace(ctx, transition{state: stateStarted, containerID: h.ID()})
	hooks.poststart(ctx, &poststartRequest{Stop: stop})

	followers := follow(hard, p, stdout, stderr)

	stopWait := p.timings.Start(timings.Wait)
	res := h.Wait(waitCtx)
	stopWait()
	stopRecords := p.timings.Start(timings.Records)
	// A self-check that never asked for the go-ahead (it refused, or the
	// run was stopped first) no longer holds the audit up.
	iso.closeHold()
	auditErr := <-audited
	if iso.posture != nil {
		ex.ImageDigest, ex.Runtime = imageDigest(p.image, iso.posture.Image), iso.posture.Runtime
		iso.imageDigest = ex.ImageDigest
	}
	ex.Exit = res
	if res.ExitCode > 0 {
		ex.ReadOnlyRootWrite = mentionsReadOnlyFS(stderr.Path(), stderr.Size())
	}
	probeErr := iso.readProbe(res)
	// What served the container stops with it (the Exited hooks), so the
	// records hold their totals.
	resp, exitedErr := hooks.exited(ctx, res)
	ex.apply(resp)
	iso.egress = resp.Egress
	ex.record = iso.record(p.ref.RunID)
	// Wait drained the container's streams; closing the spools lets the
	// consumers deliver the tail and finish.
	stdout.Close()
	stderr.Close()
	stopRecords()
	stopDrain := p.timings.Start(timings.Drain)
	followErr := followers.wait()
	ex.StreamEnded = followers.streamEnded.Load()
	stopDrain()
	if followErr != nil {
		p.log.Warn("stream output", "err", followErr)
	}
	if ex.DroppedOutputBytes = stdout.Dropped() + stderr.Dropped(); ex.DroppedOutputBytes > 0 {
		p.log.Warn("output over the cap was dropped", "cap_bytes", p.limits.maxOutput, "dropped_bytes", ex.DroppedOutputBytes)
	}
	return ex, errors.Join(auditErr, probeErr, exitedErr, res.Err)
}

// removeContainer removes the run's container in the background, on a
// context detached from ctx's cancellation; the returned channel is closed
// once it is gone (or removing it failed, which is logged: the reaper
// finds it by its labels).
func removeContainer(ctx context.Context, p *plan, h sandbox.Handle) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		defer p.timings.Start(timings.Remove)()
		if err := h.Close(closeCtx); err != nil {
			p.log.Warn("remove container", "container", h.ID(), "err", err)
		}
	}()
	return done
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

// imageDigest is the digest a run's records name its image by: the repo
// digest the image was resolved to, when the container really ran that
// image (ranID, the image ID the engine reports for it), else ranID.
func imageDigest(resolved sandbox.Image, ranID string) string {
	if ranID == "" || resolved.ID == ranID {
		return resolved.Digest()
	}
	return ranID
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
func follow(hard context.Context, p *plan, stdout, stderr *spool.Spool) *followers {
	ctx, cancel := context.WithCancel(hard)
	f := &followers{done: make(chan error, 3), ctx: ctx, cancel: cancel}
	start := func(s *spool.Spool, consume func(io.Reader) error) {
		f.n++
		go func() {
			rd := s.NewReaderContext(ctx, 0)
			defer rd.Close()
			f.done <- consume(rd)
		}()
	}
	if sender := p.in.StreamSender; sender != nil {
		start(stdout, func(rd io.Reader) error {
			_, err := workerclient.Pump(ctx, rd, p.ref.RunID, sender, workerclient.PumpOptions{})
			f.streamEnded.Store(err == nil)
			return err
		})
	}
	for _, c := range []struct {
		w io.Writer
		s *spool.Spool
	}{{p.in.Stdout, stdout}, {p.in.Stderr, stderr}} {
		if c.w != nil {
			start(c.s, func(rd io.Reader) error {
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
