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

	mu       sync.Mutex
	code     int
	oom      bool
	started  time.Time
	finished time.Time

	waitOnce  sync.Once
	result    sandbox.Result
	closeOnce sync.Once
	closed    chan struct{}
}

func newHandle(b *Backend, spec sandbox.Spec, policy sandbox.Policy, streams sandbox.Streams, args []string) *handle {
	ctx, kill := context.WithCancel(context.Background())
	now := time.Now()
	return &handle{
		b: b, id: newID(), spec: spec, policy: policy, labels: labels(spec, now), args: args,
		stdout: &gate{w: streams.Stdout}, stderr: &gate{w: streams.Stderr},
		ctx: ctx, kill: kill,
		term: make(chan struct{}), expire: make(chan struct{}), exited: make(chan struct{}), closed: make(chan struct{}),
		started: now,
	}
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

// Wait implements sandbox.Handle: it returns when the Program returns, or
// stops the container when the Spec's timeout passes, the Program calls
// TimeOut or ctx ends. No output is written after it returns.
func (h *handle) Wait(ctx context.Context) sandbox.Result {
	h.waitOnce.Do(func() { h.result = h.wait(ctx) })
	return h.result
}

func (h *handle) wait(ctx context.Context) sandbox.Result {
	var timeout <-chan time.Time
	if h.spec.Timeout > 0 {
		t := time.NewTimer(h.spec.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var timedOut, cancelled bool
	select {
	case <-h.exited:
	case <-h.closed:
	case <-timeout:
		timedOut = true
	case <-h.expire:
		timedOut = true
	case <-ctx.Done():
		cancelled = true
	}
	switch {
	case cancelled && sandbox.KillRequested(ctx):
		h.sigkill()
	case timedOut || cancelled:
		h.stop()
	}
	h.stdout.close()
	h.stderr.close()
	h.mu.Lock()
	defer h.mu.Unlock()
	return sandbox.Result{
		ExitCode:   h.code,
		OOMKilled:  h.oom,
		TimedOut:   timedOut,
		Cancelled:  cancelled,
		StartedAt:  h.started,
		FinishedAt: h.finished,
	}
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

// sigkill ends the container now: its Program's context ends and its exit
// code is KilledExitCode, whatever the Program still returns.
func (h *handle) sigkill() {
	h.mu.Lock()
	if h.finished.IsZero() {
		h.code, h.finished = KilledExitCode, time.Now()
	}
	h.mu.Unlock()
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
