package taskrun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/workspace"
)

// DefaultDiskLimitBytes caps what a run may store under /taskrun.
const DefaultDiskLimitBytes = 2 << 30

// diskWatchInterval is how often the fallback watchdog measures the run dir.
const diskWatchInterval = time.Second

// ErrDiskLimit is wrapped when the watchdog stopped a run over its disk cap.
var ErrDiskLimit = errors.New("run directory exceeded its disk cap")

// diskLimit is the run's cap in bytes; 0 means none.
func (r *runner) diskLimit() int64 {
	switch {
	case r.in.DiskLimitBytes < 0:
		return 0
	case r.in.DiskLimitBytes == 0:
		return DefaultDiskLimitBytes
	}
	return r.in.DiskLimitBytes
}

// createRunDirs creates the run directory on a size-capped filesystem when
// the host allows it (root with loop devices: the kernel then enforces the
// cap, and writes past it fail with ENOSPC inside the sandbox). Elsewhere, and
// for runs whose directory outlives them (KeepRunDir), a watchdog caps the
// run during execute instead.
func (r *runner) createRunDirs(ctx context.Context) error {
	if err := workspace.CreateRunDir(r.dirs); err != nil {
		return fmt.Errorf("create run directory: %w", err)
	}
	r.ownsRunDir = true
	if limit := r.diskLimit(); limit > 0 && !r.in.KeepRunDir {
		unmount, err := diskcap.Mount(ctx, r.dirs.Dir, limit)
		switch {
		case err == nil:
			r.unmountDisk = unmount
		case errors.Is(err, diskcap.ErrUnsupported):
			r.log.Debug("no loop-mounted disk cap; a watchdog enforces it", "reason", err)
		default:
			return fmt.Errorf("cap run directory: %w", err)
		}
	}
	if err := workspace.CreateRunDirs(r.dirs, workspace.SandboxOwner); err != nil {
		return fmt.Errorf("create run directory: %w", err)
	}
	return nil
}

// watchDisk stops the run through stop when the run dir outgrows its cap. It
// runs only when no capped filesystem was mounted; the returned function
// ends the watch and reports whether it fired.
func (r *runner) watchDisk(ctx context.Context, stop context.CancelFunc) func() error {
	limit := r.diskLimit()
	if r.unmountDisk != nil || limit == 0 {
		return func() error { return nil }
	}
	ctx, cancel := context.WithCancel(ctx)
	fired := make(chan int64, 1)
	done := make(chan error, 1)
	go func() {
		done <- diskcap.Watch(ctx, r.dirs.Dir, limit, diskWatchInterval, func(used int64) {
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

// releaseLocal drops the run's local files once everything is persisted:
// the capped filesystem is unmounted, and the run and executor directories
// are removed unless KeepRunDir. On a persist failure all of it stays: it is
// the local copy for a retry.
func (r *runner) releaseLocal(persistErr error) {
	if !r.ownsRunDir {
		return // another run's directory, or none: never touch it
	}
	if persistErr != nil {
		r.log.Warn("run directory kept for a persist retry", "dir", r.dirs.Dir, "spools", r.hostDir)
		return
	}
	if r.unmountDisk != nil {
		if err := r.unmountDisk(); err != nil {
			r.log.Warn("unmount run directory", "dir", r.dirs.Dir, "err", err)
			return
		}
	}
	if r.in.KeepRunDir {
		return
	}
	for _, dir := range []string{r.dirs.Dir, r.hostDir} {
		if err := os.RemoveAll(dir); err != nil {
			r.log.Warn("remove local run files", "dir", dir, "err", err)
		}
	}
}
