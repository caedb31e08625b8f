package executor

import (
	"time"

	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/records"
	"github.com/taskrun/taskrun/sandbox"
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
	// released is set once releaseDir ran.
	owned, released bool
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
	// lease is the host uid/gid the run holds from runInput.UIDs until
	// release; nil without a pool.
	lease *uidpool.Lease
	// owner is the uid/gid the agent runs as and that owns the directories
	// it writes: the lease, or else the policy's numeric user.
	owner workspace.Owner
	// user is the container's user when not the policy's: the lease's.
	user string
}

// policy is the run's policy with the agent's own user.
func (wd *workdir) policy(p *plan) sandbox.Policy {
	pol := p.policy
	if wd.user != "" {
		pol.User = wd.user
	}
	return pol
}
