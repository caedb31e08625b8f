package executor

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workspace"
)

// uidHook gives a cold run its own host uid/gid, when the host leases
// them (runInput.UIDs):
//
//	Prestart  the uid is leased; the agent runs as it and owns its dirs
//	Stop      the uid is given back, once the container is gone (last)
//
// Without a pool the agent runs as the policy's user.
type uidHook struct {
	p  *plan
	wd *workdir
}

func (h *uidHook) name() string { return "uid" }

func (h *uidHook) prestart(ctx context.Context, _ *prestartRequest, _ *prestartResponse) error {
	p, wd := h.p, h.wd
	defer p.timings.Start(timings.UIDLease)()
	if p.in.UIDs == nil {
		return nil
	}
	lease, err := p.in.UIDs.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("lease a host uid: %w", err)
	}
	wd.lease, wd.user = lease, lease.User()
	wd.owner = workspace.Owner{UID: lease.UID, GID: lease.GID}
	p.log.Debug("host uid leased", "uid", lease.UID)
	return nil
}

func (h *uidHook) stop(context.Context, *stopRequest) {
	releaseUID(h.p, h.wd)
}

// releaseUID gives the run's uid back, once; the container must be gone.
func releaseUID(p *plan, wd *workdir) {
	if wd.lease == nil {
		return
	}
	lease := wd.lease
	wd.lease = nil
	if err := lease.Release(); err != nil {
		p.log.Warn("release host uid", "uid", lease.UID, "err", err)
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
