package executor

import (
	"context"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/warmpool"
)

// warmHook is a claimed warm slot: it replaces the uid, run dir and dirs
// hooks and the create, since the pool made all of them:
//
//	Prestart  the run takes the slot's uid, owner and capped run dir
//	start     the parked container is released to run the command
//	Stop      a container the run never released is removed, then the
//	          run's files are released (releaseDir) and its uid last
type warmHook struct {
	p    *plan
	wd   *workdir
	slot *warmpool.Slot
}

// warmHookOf is the hook of p's claimed slot; nil for a cold run.
func warmHookOf(p *plan, wd *workdir) hook {
	if p.slot == nil {
		return nil
	}
	return &warmHook{p: p, wd: wd, slot: p.slot}
}

func (h *warmHook) name() string { return "warm" }

func (h *warmHook) prestart(context.Context, *prestartRequest, *prestartResponse) error {
	defer h.p.timings.Start(timings.UIDLease)()
	wd, slot := h.wd, h.slot
	// The slot's container already runs as its own uid; the pool made its
	// directory as a cold run's, disk cap included.
	wd.lease, wd.owner, wd.user = slot.Lease(), slot.Owner(), slot.User()
	if wd.lease != nil {
		wd.user = wd.lease.User()
	}
	wd.owned, wd.unmount = true, slot.Unmount()
	return nil
}

func (h *warmHook) start(ctx context.Context, spec sandbox.Spec, streams sandbox.Streams) (sandbox.Handle, error) {
	return h.slot.Release(ctx, spec, streams)
}

func (h *warmHook) stop(_ context.Context, req *stopRequest) {
	// A claimed container the run never released is removed before its
	// uid is given back.
	if err := h.slot.Close(context.Background()); err != nil {
		h.p.log.Warn("remove the warm container", "slot", h.slot.ID(), "err", err)
	}
	releaseDir(h.p, h.wd, req.PersistErr, false)
	releaseUID(h.p, h.wd)
}
