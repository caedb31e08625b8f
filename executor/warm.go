package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/warmpool"
	"github.com/taskrun/taskrun/workspace"
)

// warmTemplate is the warm pool key of runs shaped like input (its IDs,
// workspace, prompt, model and environment do not matter): give it to
// input.WarmPool's Warm or WaitReady to keep containers ready for such runs
// before the first one comes. It validates input and resolves its image
// (input.Pull applies) as execute does.
func warmTemplate(ctx context.Context, input runInput) (warmpool.Template, error) {
	p, err := newPlan(input)
	if err != nil {
		return warmpool.Template{}, err
	}
	if input.Sandbox != nil {
		if err := p.preflight(ctx); err != nil {
			return warmpool.Template{}, err
		}
	}
	if len(p.helpers) == 0 {
		return warmpool.Template{}, fmt.Errorf("%w: a warm container parks at the self-check: set Helpers or HelpersDir", ErrInvalidInput)
	}
	return p.warmTemplate(), nil
}

// warmTemplate is the pool key of p's container: everything the cold path
// would create it with, but the run's directory, identity and command.
func (p *plan) warmTemplate() warmpool.Template {
	labels := egressLabels(p, p.spec.Labels)
	delete(labels, sandbox.LabelRunDir)
	opts := auditOptions(p, p.policy)
	opts.Mounts.RunDir = "" // each slot's own
	leasing := p.in.UIDs != nil
	expect := expectation(p.policy, p.caps)
	if leasing {
		expect.UID = nil // each slot's own
	}
	image := p.spec.Image
	if p.image.ID != "" {
		image = p.image.ID // pinned to what preflight resolved
	}
	return warmpool.Template{
		Image:      image,
		Policy:     p.policy,
		LeaseUIDs:  leasing,
		Owner:      policyOwner(p.policy.User),
		Mounts:     p.helpers.Mounts(),
		Gate:       helpers.ProbePath,
		WorkingDir: p.spec.WorkingDir,
		Labels:     labels,
		DiskLimit:  p.limits.disk,
		Timeout:    p.spec.Timeout,
		StopGrace:  p.spec.StopGrace,
		Expect:     expect,
		Audit:      opts,
	}
}

// claimWarm gives the run a warm container when input.WarmPool has one of
// the run's key: the run's directories become the slot's. A run the pool
// cannot serve, or finds none ready for, goes the cold path.
// It returns when it began, for the run's timings.
func claimWarm(ctx context.Context, p *plan) time.Time {
	begin := time.Now()
	pool := p.in.WarmPool
	switch {
	case pool == nil:
		return begin
	case pool.Backend() != p.in.Sandbox:
		p.log.Warn("warm pool not used: it runs on another backend than the run's Sandbox")
		return begin
	case len(p.helpers) == 0:
		p.log.Debug("warm pool not used: the run has no self-check to park at")
		return begin
	}
	slot, err := pool.Claim(ctx, p.warmTemplate())
	if err != nil {
		if errors.Is(err, warmpool.ErrEmpty) {
			p.log.Debug("no warm container ready; starting cold", "err", err)
		} else {
			p.log.Warn("warm pool not used", "err", err)
		}
		return begin
	}
	p.slot = slot
	p.useDirs(slot.Dir(), slot.Dir()+hostDirSuffix)
	p.log.Debug("warm container claimed", "slot", slot.ID(), "container", slot.ContainerID())
	return begin
}

// useDirs moves the run's directories to dir (and its executor directory
// to hostDir): a warm slot's, or where the journal says a run ran.
func (p *plan) useDirs(dir, hostDir string) {
	p.dirs = workspace.RunDirsAt(dir)
	p.hostDir = hostDir
	p.spec.Labels[sandbox.LabelRunDir] = dir
	p.spec.Mounts[0].Source = dir // the run dir's mount (baseSpec)
}

// poolSlot is the ID of the run's warm slot, "" for a cold run.
func (p *plan) poolSlot() string {
	if p.slot == nil {
		return ""
	}
	return p.slot.ID()
}

// adoptJournaledDirs points a recovered or retried run at the directories
// it ran in when it ran in a warm slot.
func (p *plan) adoptJournaledDirs(rec journal.Record) {
	if rec.PoolSlot != "" && rec.RunDir != "" {
		p.useDirs(rec.RunDir, rec.SpoolDir)
	}
}

// warmDiskCap is the journal's record of the claimed slot's disk cap,
// mounted already: one write records it. Nil for a cold run.
func (p *plan) warmDiskCap() *journal.DiskCap {
	if p.slot == nil || p.slot.Unmount() == nil {
		return nil
	}
	return &journal.DiskCap{Image: diskcap.ImagePath(p.dirs.Dir), Mount: p.dirs.Dir, Mounted: true}
}

// discardWarm destroys the warm container of a run refused before it
// prepared anything.
func discardWarm(ctx context.Context, p *plan) {
	if p.slot == nil {
		return
	}
	if err := p.slot.Discard(context.WithoutCancel(ctx)); err != nil {
		p.log.Warn("discard the warm container", "slot", p.slot.ID(), "err", err)
	}
}
