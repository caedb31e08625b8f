package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/journal"
)

// Deadlines of the phases after the container, each on a context detached
// from the caller's cancellation. A run therefore reports RUNNING for at most
// its timeout, plus the container's stop grace, streamDrainTimeout, the
// persist and the report deadlines.
const (
	// DefaultPersistTimeout bounds storing one run's outputs (logs,
	// artifacts, session state). A store that hangs past it leaves the run
	// kept on the host for `taskrun persist`.
	DefaultPersistTimeout = 5 * time.Minute
	// DefaultReportTimeout bounds the final report to the control plane.
	DefaultReportTimeout = time.Minute
)

// JournalDirName is the journal's directory under the runs root.
const JournalDirName = "journal"

// PoolDirName is the warm pool's directory under the runs root: give
// PoolDir(root) to warmpool.Config.Dir, so `taskrun gc` sweeps what a
// crashed executor's pool left there.
const PoolDirName = "pool"

// PoolDir is the warm pool's directory under the runs root.
func PoolDir(root string) string { return filepath.Join(root, PoolDirName) }

// ExecutorsDirName is where executor instances keep their lock files, under
// the runs root.
const ExecutorsDirName = "executors"

// DiskCapTemplatesDirName holds, under the runs root, the pre-formatted
// images the runs' disk caps are copied from (diskcap.WithTemplates).
const DiskCapTemplatesDirName = "diskcap"

// DiskCapTemplatesDir is the disk cap templates' directory under the runs
// root: give it to warmpool.Config.DiskCapTemplates.
func DiskCapTemplatesDir(root string) string { return filepath.Join(root, DiskCapTemplatesDirName) }

// recordsSlackBytes is the room admission keeps for the run's records
// (journal, audit.json, gateway record) beside its spools.
const recordsSlackBytes = 16 << 20

// OpenRunJournal opens the journal of the runs under root.
func OpenRunJournal(root string) (*journal.Dir, error) {
	return journal.Open(filepath.Join(root, JournalDirName))
}

// runsRoot is the root of the runs' layout (Host.Layout), or "" for an
// input without one.
func runsRoot(p *plan) string { return p.in.root }

// openJournal resolves the run's journal: input.Journal, or the one under
// the runs root; nil when there is neither.
func openJournal(p *plan) (*journal.Dir, error) {
	if p.in.Journal != nil {
		return p.in.Journal, nil
	}
	root := runsRoot(p)
	if root == "" {
		return nil, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("create runs root: %w", err)
	}
	return OpenRunJournal(root)
}

// admit refuses a run the runs root has no room for: its disk cap, both
// output spools at their cap and its records.
func admit(p *plan) error {
	root := runsRoot(p)
	if root == "" {
		return nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("create runs root: %w", err)
	}
	need := DiskNeed(p.limits.disk, p.limits.maxOutput)
	if err := diskcap.Admit(root, need); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	return nil
}

// DiskNeed is the free space under the runs root a run needs to be
// admitted: its disk cap, both output spools at their cap and room for its
// records. diskLimit and maxOutput are the run's effective limits (no cap: 0).
func DiskNeed(diskLimit, maxOutput int64) int64 {
	return max(diskLimit, 0) + 2*max(maxOutput, 0) + recordsSlackBytes
}

// beginJournal records the run before anything of it exists on disk. The
// record is exclusive: a second run with the same ID is refused here,
// before it can touch the first one's files. started is the run's start
// time, the one its run index record is keyed by: recovery indexes the run
// under the same key.
func beginJournal(p *plan, started time.Time) (*journal.Entry, error) {
	d, err := openJournal(p)
	if err != nil || d == nil {
		return nil, err
	}
	return d.Create(journal.Record{
		DiskCap: p.warmDiskCap(),
		RunID:   p.ref.RunID, UserID: p.ref.UserID, ConversationID: p.ref.ConversationID, TaskID: p.ref.TaskID,
		SessionID: p.in.SessionID, PreviousRunID: p.in.Run.PreviousRunID, ParentRunID: p.in.Run.ParentRunID,
		Executor: p.in.Executor, RunDir: p.dirs.Dir, SpoolDir: p.hostDir, PoolSlot: p.poolSlot(),
		Store: journal.RedactURL(p.in.StoreURL), ControlPlane: p.in.ControlPlane,
		KeepRunDir: p.keepRunDir, SessionExcludes: p.sessionExcludes, MaxOutputBytes: p.limits.maxOutput,
		Timeout: p.spec.Timeout, Phase: journal.PhasePrepare, StartedAt: started,
		Pending: []journal.Pending{journal.PendingRelease, journal.PendingReport},
	})
}

// claimJournal takes over the journal record of a run whose executor is
// gone, if it has one.
func claimJournal(p *plan) (*journal.Entry, error) {
	d, err := openJournal(p)
	if err != nil || d == nil {
		return nil, err
	}
	e, err := d.Claim(p.ref.RunID)
	if errors.Is(err, journal.ErrNotFound) {
		return nil, nil
	}
	return e, err
}

// refusedForReuse reports whether err refused a run ID that another run
// holds: nothing may be reported for it, since the control plane's record
// is the other run's.
func refusedForReuse(err error) bool { return errors.Is(err, journal.ErrExists) }

// reportError marks the final PATCH's failure in report's error.
type reportError struct{ error }

func (e reportError) Unwrap() error { return e.error }

// reportFailed reports whether err holds a failed final report.
func reportFailed(err error) bool {
	var re reportError
	return errors.As(err, &re)
}

// shutdownContext is ctx without its cancellation, ended grace after ctx is
// cancelled: the phases after the container keep running when the caller
// cancels, but no longer than the grace. A grace of zero never ends it.
func shutdownContext(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	hard, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if grace <= 0 {
		return hard, cancel
	}
	stop := context.AfterFunc(ctx, func() {
		select {
		case <-time.After(grace):
			cancel()
		case <-hard.Done():
		}
	})
	return hard, func() {
		stop()
		cancel()
	}
}

// deadline returns d, or def when d is zero.
func deadline(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
