package sandboxfake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/taskrun/taskrun/sandbox"
)

// defaultStopGrace is the grace of a Spec that sets none, as Docker's.
const defaultStopGrace = 10 * time.Second

// ErrRemoved is returned by Posture after Close.
var ErrRemoved = errors.New("sandboxfake: no such container")

// handle is one fake container.
type handle struct {
	b      *Backend
	id     string
	spec   sandbox.Spec
	policy sandbox.Policy
	labels map[string]string
	args   []string
	stdout *gate
	stderr *gate

	ctx  context.Context // ends on SIGKILL
	kill context.CancelFunc

	term       chan struct{} // SIGTERM
	termOnce   sync.Once
	expire     chan struct{} // Process.TimeOut
	expireOnce sync.Once
	exited     chan struct{} // the Program returned
	ended      chan struct{} // exited or closed: Wait has nothing to stop

	mu       sync.Mutex
	code     int
	oom      bool
	stats    sandbox.Stats
	reads    int64 // calls of Stats
	started  time.Time
	finished time.Time

	waiter    sandbox.Waiter
	closeOnce sync.Once
	closed    chan struct{}
}

func newHandle(b *Backend, spec sandbox.Spec, policy sandbox.Policy, streams sandbox.Streams, args []string) *handle {
	ctx, kill := context.WithCancel(context.Background())
	now := time.Now()
	h := &handle{
		b: b, id: newID(), spec: spec, policy: policy, labels: labels(spec, now), args: args,
		stdout: &gate{w: streams.Stdout}, stderr: &gate{w: streams.Stderr},
		ctx: ctx, kill: kill,
		term: make(chan struct{}), expire: make(chan struct{}), exited: make(chan struct{}), ended: make(chan struct{}),
		closed: make(chan struct{}), started: now,
	}
	go func() {
		select {
		case <-h.exited:
		case <-h.closed:
		}
		close(h.ended)
	}()
	return h
}

// run runs the Program and records its exit.
func (h *handle) run(prog Program) {
	p := &Process{Args: h.args, Spec: h.spec, Policy: h.policy, Stdout: h.stdout, Stderr: h.stderr, h: h}
	code := prog(h.ctx, p)
	h.mu.Lock()
	if h.finished.IsZero() { // not killed meanwhile
		h.code, h.finished = code, time.Now()
	}
	h.mu.Unlock()
	close(h.exited)
}

// ID implements sandbox.Handle.
func (h *handle) ID() string { return h.id }

// Posture implements sandbox.Handle.
func (h *handle) Posture(ctx context.Context) (sandbox.Posture, error) {
	if err := ctx.Err(); err != nil {
		return sandbox.Posture{}, err
	}
	select {
	case <-h.closed:
		return sandbox.Posture{}, fmt.Errorf("%w: %s", ErrRemoved, h.id)
	default:
	}
	return h.b.posture(h), nil
}

// Stats implements sandbox.StatsReader: the figures the Program last set
// (Process.SetStats), while it runs; sandbox.ErrNotRunning once it
// returned, was killed or the container was removed.
func (h *handle) Stats(ctx context.Context) (sandbox.Stats, error) {
	if err := ctx.Err(); err != nil {
		return sandbox.Stats{}, err
	}
	h.b.statsReads.Add(1)
	h.mu.Lock()
	h.reads++
	h.mu.Unlock()
	select {
	case <-h.ended:
		return sandbox.Stats{}, fmt.Errorf("%w: %s", sandbox.ErrNotRunning, h.id)
	case <-h.ctx.Done():
		return sandbox.Stats{}, fmt.Errorf("%w: %s", sandbox.ErrNotRunning, h.id)
	default:
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats, nil
}

// Wait implements sandbox.Handle: it returns when the Program returns or the
// container is removed, or stops the container when the Spec's timeout
// passes, the Program calls TimeOut or ctx ends. No output is written after
// it returns.
func (h *handle) Wait(ctx context.Context) sandbox.Result {
	return h.waiter.Wait(ctx, sandbox.WaitSteps{
		Exited:  h.ended,
		Started: h.started,
		Timeout: h.spec.Timeout,
		Expire:  h.expire,
		Stop: func(_ context.Context, kill bool) {
			if kill {
				h.sigkill()
				return
			}
			h.stop()
		},
		Finish: func(_ context.Context, res *sandbox.Result) {
			h.stdout.close()
			h.stderr.close()
			h.mu.Lock()
			defer h.mu.Unlock()
			res.ExitCode, res.OOMKilled, res.StartedAt, res.FinishedAt = h.code, h.oom, h.started, h.finished
		},
	})
}

// stop sends SIGTERM, then SIGKILL when the Program has not returned after
// the stop grace.
func (h *handle) stop() {
	h.termOnce.Do(func() { close(h.term) })
	grace := h.spec.StopGrace
	if grace <= 0 {
		grace = defaultStopGrace
	}
	if h.b.maxGrace > 0 && grace > h.b.maxGrace {
		grace = h.b.maxGrace
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-h.exited:
	case <-h.closed:
	case <-t.C:
		h.sigkill()
	}
}

// sigkill ends the container now: its output closes before its Program's
// context ends, so nothing the Program writes afterwards reaches the
// streams, and its exit code is KilledExitCode, whatever the Program still
// returns.
func (h *handle) sigkill() {
	h.mu.Lock()
	if h.finished.IsZero() {
		h.code, h.finished = KilledExitCode, time.Now()
	}
	h.mu.Unlock()
	h.stdout.close()
	h.stderr.close()
	h.kill()
}

// Close implements sandbox.Handle: it kills a running container and removes
// it. It is idempotent.
func (h *handle) Close(context.Context) error {
	h.closeOnce.Do(func() {
		h.termOnce.Do(func() { close(h.term) })
		h.sigkill()
		close(h.closed)
		h.stdout.close()
		h.stderr.close()
		h.b.remove(h.id)
	})
	return nil
}

// gate passes writes to w until closed; a nil w discards them.
type gate struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (g *gate) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.closed:
		return 0, io.ErrClosedPipe
	case g.w == nil:
		return len(p), nil
	}
	return g.w.Write(p)
}

// close waits for a write in progress and refuses every later one.
func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

var _ sandbox.StatsReader = (*handle)(nil)
