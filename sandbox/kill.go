package sandbox

import (
	"context"
	"errors"
)

// killNow is a cancellation cause that asks for the container to be killed
// at once.
type killNow struct{ err error }

func (k *killNow) Error() string {
	if k.err == nil {
		return "container killed at once"
	}
	return k.err.Error()
}

func (k *killNow) Unwrap() error { return k.err }

// KillNow wraps err as the cause of a cancellation (context.CancelCauseFunc)
// that asks the backend to kill the container at once (SIGKILL, no stop
// grace) instead of stopping it: for a run whose lease was lost, which
// another worker may already hold. errors.Is and errors.As still see err.
func KillNow(err error) error { return &killNow{err: err} }

// KillRequested reports whether ctx was cancelled with a cause made by
// KillNow. A plain cancellation or a timeout stops the container with its
// grace, as before.
func KillRequested(ctx context.Context) bool {
	if ctx.Err() == nil {
		return false
	}
	var k *killNow
	return errors.As(context.Cause(ctx), &k)
}
