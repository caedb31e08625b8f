package taskrun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/taskrun/taskrun/agentmd"
	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/records"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/workspace"
)

// workdir is the run's directory on the host as prepare left it: what the
// later phases may use and release must undo.
type workdir struct {
	// started is when the run began preparing.
	started time.Time
	// streamLoss says what of the stdout stream the control plane did not
	// acknowledge (finishStream); nil when it holds it all.
	streamLoss error
	// owned is set once this run created its directory; only then may it be
	// removed. A reused run ID must never touch the first run's files.
	owned bool
	// unmount releases the run dir's size-capped filesystem; nil when none
	// is mounted (a watchdog enforces the cap instead, see watchDisk).
	unmount func() error
	// journal is the run's journal record; nil without a journal.
	journal *journal.Entry
	// records is the budget of the host-side records written for the run:
	// spools, trace lines, the gateway record, the isolation record. Nil
	// for a retry, which writes none.
	records *records.Budget
	// isolationRoom is the part of records set aside for the isolation
	// record, so that a flood of output cannot cost the run its record.
	isolationRoom int64
	// lease is the host uid/gid the run holds from RunTaskInput.UIDs until
	// release; nil without a pool.
	lease *uidpool.Lease
	// owner is the uid/gid the agent runs as and that owns the directories
	// it writes: the lease, or else the policy's numeric user.
	owner workspace.Owner
}

// policy is the run's policy with the agent's own user.
func (wd *workdir) policy(p *plan) sandbox.Policy {
	pol := p.policy
	switch {
	case wd.lease != nil:
		pol.User = wd.lease.User()
	case p.slot != nil:
		pol.User = p.slot.User()
	}
	return pol
}

// leaseUID takes the run's own host uid/gid from the pool, when there is
// one, and settles who owns the run's directories.
func (wd *workdir) leaseUID(ctx context.Context, p *plan) error {
	wd.owner = policyOwner(p.policy.User)
	if p.slot != nil {
		// The slot's container already runs as its own uid.
		wd.lease, wd.owner = p.slot.Lease(), p.slot.Owner()
		return nil
	}
	if p.in.UIDs == nil {
		return nil
	}
	lease, err := p.in.UIDs.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("lease a host uid: %w", err)
	}
	wd.lease = lease
	wd.owner = workspace.Owner{UID: lease.UID, GID: lease.GID}
	p.log.Debug("host uid leased", "uid", lease.UID)
	return nil
}

// releaseUID gives the run's uid back; the container must be gone.
func (wd *workdir) releaseUID(p *plan) {
	if wd.lease == nil {
		return
	}
	if err := wd.lease.Release(); err != nil {
		p.log.Warn("release host uid", "uid", wd.lease.UID, "err", err)
	}
}

// policyOwner is the numeric "UID:GID" of a policy's user, or
// workspace.SandboxOwner when it is not numeric.
func policyOwner(user string) workspace.Owner {
	u, g, ok := strings.Cut(user, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil {
		return workspace.SandboxOwner
	}
	return workspace.Owner{UID: uid, GID: gid}
}

// reserveHook takes what the run's container is created with, the run's
// own uid and its (empty) run directory, and gives them back (release)
// once the run is collected.
type reserveHook struct {
	p        *plan
	wd       *workdir
	released bool
}

func (h *reserveHook) name() string { return "reserve" }

// prestart leases the uid and creates the run directory.
func (h *reserveHook) prestart(ctx context.Context, _ *prestartRequest) error {
	p, wd := h.p, h.wd
	if err := p.timings.Time(timings.UIDLease, func() error { return wd.leaseUID(ctx, p) }); err != nil {
		return err
	}
	if p.slot != nil {
		// The pool made the slot's directory as prepare would, disk cap
		// included, before starting its container.
		wd.owned, wd.unmount = true, p.slot.Unmount()
		return nil
	}
	if err := workspace.CreateRunDir(p.dirs); err != nil {
		return fmt.Errorf("create run directory: %w", err)
	}
	wd.owned = true
	return nil
}

// stop releases the run's files and uid (release).
func (h *reserveHook) stop(_ context.Context, req *stopRequest) {
	if h.released {
		return
	}
	h.released = true
	release(h.p, h.wd, req.PersistErr)
}

// prepareHook fills the run directory reserveHook made (prepare).
type prepareHook struct {
	p  *plan
	wd *workdir
}

func (h *prepareHook) name() string { return "prepare" }

func (h *prepareHook) prestart(ctx context.Context, _ *prestartRequest) error {
	return prepare(ctx, h.p, h.wd)
}

// prepare materializes the run directory reserve made: dirs under the disk
// cap, the user's persistent files and the workspace or the resumed session,
// the prompt and AGENTS.md. The engine may be creating the container
// meanwhile: it reads the directory only when the container starts.
func prepare(ctx context.Context, p *plan, wd *workdir) error {
	if err := wd.capRunDir(ctx, p); err != nil {
		return err
	}
	if err := wd.createRunDirs(p); err != nil {
		return err
	}
	if err := os.MkdirAll(p.hostDir, 0o700); err != nil {
		return fmt.Errorf("create executor directory: %w", err)
	}
	stopMaterialize := p.timings.Start(timings.Materialize)
	defer stopMaterialize()
	if prev := p.in.Run.PreviousRunID; prev != "" {
		// The previous run's home already holds the persistent files and the
		// workspace as that run left them.
		if err := restoreSession(ctx, p, prev, wd.owner); err != nil {
			return diskcap.Explain(p.dirs.Dir, err)
		}
	} else if err := materializeHome(ctx, p, wd.owner); err != nil {
		return diskcap.Explain(p.dirs.Dir, err)
	}
	stopMaterialize()
	p.timings.Time(timings.Snapshot, func() error { snapshotChanges(ctx, p); return nil })
	if err := os.WriteFile(filepath.Join(p.dirs.Dir, model.PromptFileName), []byte(p.in.Task.Prompt), 0o644); err != nil {
		return fmt.Errorf("write prompt: %w", err)
	}
	instructions := agentmd.InstructionsDir(p.dirs.Home, p.in.Task.WorkspaceDir, p.in.Run.PreviousRunID != "")
	if err := WriteRunAgentsMd(p.dirs.Dir, instructions); err != nil {
		return fmt.Errorf("write AGENTS.md: %w", err)
	}
	return nil
}

// capRunDir puts the run directory under a size-capped filesystem when the
// host allows it (root with loop devices: the kernel then enforces the cap,
// and writes or fallocate past it fail with ENOSPC inside the sandbox), also
// for runs whose directory outlives them (KeepRunDir: release turns it into
// a plain copy). Elsewhere a watchdog caps the run during supervise. A warm
// slot's directory is capped already.
func (wd *workdir) capRunDir(ctx context.Context, p *plan) error {
	if p.slot != nil || p.limits.disk <= 0 {
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

// createRunDirs creates the directories inside the run directory, owned by
// the run's owner; a warm slot has them already.
func (wd *workdir) createRunDirs(p *plan) error {
	if p.slot != nil {
		return nil
	}
	if err := workspace.CreateRunDirs(p.dirs, wd.owner); err != nil {
		return fmt.Errorf("create run directory: %w", err)
	}
	return nil
}

// materializeHome copies the user's persistent files, then the task's
// workspace, into home, owned by owner.
func materializeHome(ctx context.Context, p *plan, owner workspace.Owner) error {
	opts := workspace.CopyOptions{Owner: &owner}
	if dir := p.in.Paths.PersistentUserDir(p.ref.UserID); dirExists(dir) {
		if _, err := workspace.CopyTree(ctx, dir, p.dirs.Home, opts); err != nil {
			return fmt.Errorf("copy persistent user files: %w", err)
		}
	}
	if dir := p.in.Task.WorkspaceDir; dir != "" {
		if _, err := workspace.CopyTree(ctx, dir, p.dirs.Home, opts); err != nil {
			return fmt.Errorf("copy workspace %s: %w", dir, err)
		}
	}
	return nil
}

// restoreSession unpacks the previous run's session state into home, owned
// by owner. A rejected archive entry fails the run: a partial restore is
// never used.
func restoreSession(ctx context.Context, p *plan, prevRunID string, owner workspace.Owner) error {
	rc, err := p.in.Persist.OpenRunFile(ctx, p.ref.WithRun(prevRunID), SessionStateName)
	if err != nil {
		return fmt.Errorf("fetch session state of run %s: %w", prevRunID, err)
	}
	defer rc.Close()
	opts := workspace.UnpackOptions{Owner: &owner}
	if _, err := workspace.UnpackHome(ctx, rc, p.dirs.Home, opts); err != nil {
		return fmt.Errorf("restore session state of run %s: %w", prevRunID, err)
	}
	return nil
}

func dirExists(dir string) bool {
	info, err := os.Stat(dir)
	return err == nil && info.IsDir()
}
