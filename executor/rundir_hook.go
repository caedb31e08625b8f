package executor

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workspace"
)

// rundirHook gives a cold run its (empty) run directory, above the create
// point, and releases it once the run is collected:
//
//	Prestart  the run directory is created; the run owns it
//	Stop      the run's local files go once stored (releaseDir), or stay
//	          as the kept copy for RetryPersist
type rundirHook struct {
	p  *plan
	wd *workdir
}

func (h *rundirHook) name() string { return "rundir" }

func (h *rundirHook) prestart(context.Context, *prestartRequest, *prestartResponse) error {
	if err := workspace.CreateRunDir(h.p.dirs); err != nil {
		return fmt.Errorf("create run directory: %w", err)
	}
	h.wd.owned = true
	return nil
}

func (h *rundirHook) stop(_ context.Context, req *stopRequest) {
	releaseDir(h.p, h.wd, req.PersistErr, true)
}

// dirsHook fills a cold run's directory below the create point: the disk
// cap, then the directories the agent writes, owned by it, and the
// executor's directory beside it.
type dirsHook struct {
	p  *plan
	wd *workdir
}

func (h *dirsHook) name() string { return "dirs" }

func (h *dirsHook) prestart(ctx context.Context, _ *prestartRequest, resp *prestartResponse) error {
	p, wd := h.p, h.wd
	if err := wd.capRunDir(ctx, p); err != nil {
		return err
	}
	resp.DiskCapMounted = wd.unmount != nil
	if err := workspace.CreateRunDirs(p.dirs, wd.owner); err != nil {
		return fmt.Errorf("create run directory: %w", err)
	}
	return nil
}

// capRunDir puts the run directory under a size-capped filesystem when the
// host allows it (root with loop devices: the kernel then enforces the cap,
// and writes or fallocate past it fail with ENOSPC inside the sandbox), also
// for runs whose directory outlives them (KeepRunDir: release turns it into
// a plain copy). Elsewhere a watchdog caps the run (diskWatchHook).
func (wd *workdir) capRunDir(ctx context.Context, p *plan) error {
	if p.limits.disk <= 0 {
		return nil
	}
	stopCap := p.timings.Start(timings.DiskCap)
	unmount, err := diskcap.Mount(ctx, p.dirs.Dir, p.limits.disk, diskCapOptions(p)...)
	stopCap()
	switch {
	case err == nil:
		wd.unmount = unmount
	case errors.Is(err, diskcap.ErrUnsupported):
		p.log.Debug("no loop-mounted disk cap; a watchdog enforces it", "reason", err)
	default:
		return fmt.Errorf("cap run directory: %w", err)
	}
	return nil
}

// diskCapOptions are the disk cap options of a run of p: its images are
// copied from the runs root's templates, when the root is known.
func diskCapOptions(p *plan) []diskcap.Option {
	if root := runsRoot(p); root != "" {
		return []diskcap.Option{diskcap.WithTemplates(DiskCapTemplatesDir(root))}
	}
	return nil
}

// releaseDir drops the run's local files once everything is persisted,
// once: the capped filesystem is unmounted, and the run and executor
// directories are removed unless KeepRunDir, which keeps a plain copy of
// what the run allocated (diskcap.Keep) and no mount. On a persist failure
// all of it stays: it is the local copy for RetryPersist. prune removes
// the run's ancestors it was the last of (a warm slot's are the pool's).
func releaseDir(p *plan, wd *workdir, persistErr error, prune bool) {
	if wd == nil || !wd.owned || wd.released {
		return // another run's directory, or none: never touch it
	}
	wd.released = true
	switch {
	case persistErr != nil:
		keepForRetry(p, wd)
	case wd.unmount != nil && p.keepRunDir:
		keepCapped(p, wd)
	case wd.unmount != nil && !unmountRunDir(p, wd):
		// The unmount failed: the directory stays.
	case p.keepRunDir:
	default:
		removeRunDir(p, prune)
	}
}

// keepForRetry leaves the run's files for RetryPersist; the kept copy
// holds no mount: its image waits unmounted.
func keepForRetry(p *plan, wd *workdir) {
	if wd.unmount != nil {
		if err := diskcap.Detach(p.dirs.Dir); err != nil {
			p.log.Warn("detach the kept run directory's disk cap", "dir", p.dirs.Dir, "err", err)
		}
	}
	p.log.Warn("run directory kept for a persist retry", "dir", p.dirs.Dir, "spools", p.hostDir)
}

// keepCapped turns a capped run dir kept by KeepRunDir into a plain copy.
func keepCapped(p *plan, wd *workdir) {
	stats, err := diskcap.Keep(context.Background(), p.dirs.Dir, wd.unmount, p.limits.disk)
	for _, s := range stats.Skipped {
		p.log.Warn("left out of the kept run directory", "path", s.Path, "reason", s.Reason)
	}
	if err != nil {
		p.log.Warn("keep run directory", "dir", p.dirs.Dir, "err", err)
	}
}

// unmountRunDir releases the run dir's capped filesystem; false when it
// failed and the directory must stay.
func unmountRunDir(p *plan, wd *workdir) bool {
	if err := wd.unmount(); err != nil {
		p.log.Warn("unmount run directory", "dir", p.dirs.Dir, "err", err)
		return false
	}
	return true
}

// removeRunDir removes the run and executor directories and, with prune,
// the task, conversation and user directories the run was the last of:
// finished runs leave no empty directories.
func removeRunDir(p *plan, prune bool) {
	removed := true
	for _, dir := range []string{p.dirs.Dir, p.hostDir} {
		if err := os.RemoveAll(dir); err != nil {
			removed = false
			p.log.Warn("remove local run files", "dir", dir, "err", err)
		}
	}
	if removed && prune {
		if err := workspace.PruneRunAncestors(p.dirs.Dir); err != nil {
			p.log.Warn("remove empty run ancestors", "dir", p.dirs.Dir, "err", err)
		}
	}
}
