package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/taskrun/taskrun/diskcap"
)

// ErrDiskLimit is wrapped when the watchdog stopped a run over its disk cap.
var ErrDiskLimit = errors.New("run directory exceeded its disk cap")

// diskWatchHook caps a run whose directory got no size-capped filesystem
// (the kernel enforces a loop-mounted cap by itself):
//
//	Poststart  a watchdog measures the run dir and stops the run over its cap
//	Exited     the watch ends; the error says whether it fired
type diskWatchHook struct {
	p   *plan
	wd  *workdir
	end func() error
}

func (h *diskWatchHook) name() string { return "diskwatch" }

func (h *diskWatchHook) poststart(ctx context.Context, req *poststartRequest) {
	h.end = watchDisk(ctx, h.p, h.wd, req.Stop)
}

func (h *diskWatchHook) exited(context.Context, *exitedRequest, *exitedResponse) error {
	if h.end == nil {
		return nil
	}
	end := h.end
	h.end = nil
	return end()
}

// watchDisk stops the run through stop when the run dir outgrows its cap. It
// runs only when no capped filesystem was mounted; the returned function
// ends the watch and reports whether it fired.
func watchDisk(ctx context.Context, p *plan, wd *workdir, stop context.CancelFunc) func() error {
	limit := p.limits.disk
	if wd.unmount != nil || limit == 0 {
		return func() error { return nil }
	}
	ctx, cancel := context.WithCancel(ctx)
	fired := make(chan int64, 1)
	done := make(chan error, 1)
	go func() {
		done <- diskcap.Watch(ctx, p.dirs.Dir, limit, diskcap.DefaultInterval, func(used int64) {
			fired <- used
			stop()
		})
	}()
	return func() error {
		cancel()
		watchErr := <-done
		select {
		case used := <-fired:
			if errors.Is(watchErr, diskcap.ErrUnmeasurable) {
				return fmt.Errorf("%w: %w", ErrDiskLimit, watchErr)
			}
			return fmt.Errorf("%w: %d bytes used, cap %d", ErrDiskLimit, used, limit)
		default:
			return nil
		}
	}
}
