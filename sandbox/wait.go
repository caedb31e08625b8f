package sandbox

import (
	"context"
	"sync"
	"time"
)

// WaitSteps are a backend's parts of Handle.Wait; Waiter runs them in the
// order the contract fixes.
type WaitSteps struct {
	// Exited is closed once the container exited (for a backend that cannot
	// see the exit itself: once its output ended with it).
	Exited <-chan struct{}
	// Started and Timeout place the Spec's deadline: Timeout after Started.
	// Zero Timeout: none.
	Started time.Time
	Timeout time.Duration
	// Expire, when not nil, ends the wait like the deadline once closed.
	Expire <-chan struct{}
	// Stop stops the running container: with SIGTERM and, after the Spec's
	// StopGrace, SIGKILL; with SIGKILL at once when kill is set (the wait's
	// context was cancelled with KillNow).
	Stop func(ctx context.Context, kill bool)
	// Finish waits for the exit (after a stop), drains the output and fills
	// in res, whose TimedOut and Cancelled are already set. ctx may be
	// cancelled already: Finish bounds its own work.
	Finish func(ctx context.Context, res *Result)
}

// Waiter is the skeleton of Handle.Wait that every backend shares: it runs
// once, returning the same Result to later calls; it waits for the exit,
// the deadline (counted from the container's start) or ctx; on the deadline
// or ctx it stops the container unless it exited meanwhile, killing it at
// once when KillRequested(ctx), and reports TimedOut or Cancelled only when
// it stopped it; then the backend finishes the Result. The zero Waiter is
// ready to use.
type Waiter struct {
	once   sync.Once
	result Result
}

// Wait runs s once and returns its Result.
func (w *Waiter) Wait(ctx context.Context, s WaitSteps) Result {
	w.once.Do(func() { w.result = wait(ctx, s) })
	return w.result
}

func wait(ctx context.Context, s WaitSteps) Result {
	res := Result{ExitCode: -1}
	var deadline <-chan time.Time
	if s.Timeout > 0 {
		t := time.NewTimer(time.Until(s.Started.Add(s.Timeout)))
		defer t.Stop()
		deadline = t.C
	}
	select {
	case <-s.Exited:
	case <-deadline:
		res.TimedOut = stopUnlessExited(ctx, s)
	case <-s.Expire:
		res.TimedOut = stopUnlessExited(ctx, s)
	case <-ctx.Done():
		res.Cancelled = stopUnlessExited(ctx, s)
	}
	s.Finish(ctx, &res)
	return res
}

// stopUnlessExited stops the container unless it exited meanwhile, and
// reports whether it stopped it.
func stopUnlessExited(ctx context.Context, s WaitSteps) bool {
	select {
	case <-s.Exited:
		return false
	default:
	}
	s.Stop(ctx, KillRequested(ctx))
	return true
}
