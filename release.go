package taskrun

import (
	"context"
	"os"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/workspace"
)

// release drops the run's local files once everything is persisted: the
// capped filesystem is unmounted, and the run and executor directories are
// removed unless KeepRunDir, which keeps a plain copy of what the run
// allocated (diskcap.Keep) and no mount. On a persist failure all of it stays: it is the
// local copy for RetryPersist. The run's host uid is given back in every
// case: the container is gone.
func release(p *plan, wd *workdir, persistErr error) {
	if wd != nil {
		defer wd.releaseUID(p)
	}
	if p.slot != nil {
		// A claimed container the run never released is removed before
		// its uid is given back.
		if err := p.slot.Close(context.Background()); err != nil {
			p.log.Warn("remove the warm container", "slot", p.slot.ID(), "err", err)
		}
	}
	if wd == nil || !wd.owned {
		return // another run's directory, or none: never touch it
	}
	if persistErr != nil {
		// The kept copy holds no mount: its image waits unmounted.
		if wd.unmount != nil {
			if err := diskcap.Detach(p.dirs.Dir); err != nil {
				p.log.Warn("detach the kept run directory's disk cap", "dir", p.dirs.Dir, "err", err)
			}
		}
		p.log.Warn("run directory kept for a persist retry", "dir", p.dirs.Dir, "spools", p.hostDir)
		return
	}
	if wd.unmount != nil && p.keepRunDir {
		stats, err := diskcap.Keep(context.Background(), p.dirs.Dir, wd.unmount, p.limits.disk)
		for _, s := range stats.Skipped {
			p.log.Warn("left out of the kept run directory", "path", s.Path, "reason", s.Reason)
		}
		if err != nil {
			p.log.Warn("keep run directory", "dir", p.dirs.Dir, "err", err)
		}
		return
	}
	if wd.unmount != nil {
		if err := wd.unmount(); err != nil {
			p.log.Warn("unmount run directory", "dir", p.dirs.Dir, "err", err)
			return
		}
	}
	if p.keepRunDir {
		return
	}
	removed := true
	for _, dir := range []string{p.dirs.Dir, p.hostDir} {
		if err := os.RemoveAll(dir); err != nil {
			removed = false
			p.log.Warn("remove local run files", "dir", dir, "err", err)
		}
	}
	if removed && p.slot == nil {
		// The task, conversation and user directories the run was the
		// last of go too: finished runs leave no empty directories.
		if err := workspace.PruneRunAncestors(p.dirs.Dir); err != nil {
			p.log.Warn("remove empty run ancestors", "dir", p.dirs.Dir, "err", err)
		}
	}
}
