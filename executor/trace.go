package executor

import (
	"context"
	"fmt"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workerclient"
)

// state is a change of a run's state that leaves the executor: in its
// journal record, the run index or the control plane.
type state string

// A run's states, in the order a run reaches them (any may be skipped).
const (
	// statePrepared: the run dir's disk cap is mounted (journal).
	statePrepared state = "prepared"
	// stateStarted: the container started (journal).
	stateStarted state = "started"
	// stateRunning: the agent was let go (index, RUNNING PATCH, in the
	// background).
	stateRunning state = "running"
	// stateJudged: the verdict, before anything is stored (journal).
	stateJudged state = "judged"
	// stateCollected: collection ended, stored or kept (journal).
	stateCollected state = "collected"
	// stateReported: the final status (index, then PATCH).
	stateReported state = "reported"
	// stateEnded: the journal record removed, or closed and kept.
	stateEnded state = "ended"
)

// transition is one traced state change and what it carries.
type transition struct {
	state state
	// containerID is the started container (stateStarted).
	containerID string
	// ex is the execution so far (stateRunning, stateJudged,
	// stateReported).
	ex *execution
	// v is the verdict (stateJudged, stateReported).
	v *verdict
	// persistErr is collection's failure (stateCollected).
	persistErr error
	// out, req and st are the final outcome, its PATCH and what was
	// stored (stateReported).
	out *Outcome
	req *workerclient.PatchTaskRunRequest
	st  *stored
	// keep keeps the journal record (stateEnded).
	keep bool
}

// tracer is the one funnel a run's state changes leave through (as
// Woodpecker's traceStep): the journal, the run index, the control plane,
// their timings and the log. Every state and every hook event is logged at
// debug level with a "step" attribute, in the order the runner reached it.
type tracer struct {
	p  *plan
	wd *workdir
	// running is closed once the RUNNING report was sent (or gave up); the
	// final report waits for it, which keeps the two in order.
	running <-chan struct{}
}

// step logs a step of the run's lifecycle that is not a state change (a
// hook event, the container's create, start or removal).
func (t *tracer) step(step string, attrs ...any) {
	t.p.log.Debug("run step", append([]any{"step", step}, attrs...)...)
}

// trace records tr where the state goes. stateReported fails with the
// final PATCH's error; stateJudged, and stateCollected of a kept run, with
// the journal's, since the record is then the only local copy of the
// run's verdict and execution (the entry keeps the change in memory, so
// the collected write retries a failed judged one).
func (t *tracer) trace(ctx context.Context, tr transition) error {
	t.step(string(tr.state))
	p, wd := t.p, t.wd
	switch tr.state {
	case statePrepared:
		_ = journalUpdate(p, wd, func(rec *journal.Record) {
			rec.DiskCap = &journal.DiskCap{Image: diskcap.ImagePath(p.dirs.Dir), Mount: p.dirs.Dir, Mounted: true}
		})
	case stateStarted:
		_ = journalUpdate(p, wd, func(rec *journal.Record) {
			rec.Phase = journal.PhaseSupervise
			rec.ContainerID = tr.containerID
			rec.Pending = []journal.Pending{journal.PendingContainer, journal.PendingPersist, journal.PendingReport, journal.PendingRelease}
		})
	case stateRunning:
		t.running = t.reportRunning(ctx, *tr.ex)
	case stateJudged:
		return journalVerdict(p, wd, *tr.v, *tr.ex)
	case stateCollected:
		return journalCollected(p, wd, tr.persistErr)
	case stateReported:
		return t.reported(ctx, tr)
	case stateEnded:
		endJournal(p, wd, tr.keep)
	}
	return nil
}

// reported indexes the run and sends the final PATCH, after the RUNNING
// one if any.
func (t *tracer) reported(ctx context.Context, tr transition) error {
	p := t.p
	if t.running != nil {
		select {
		case <-t.running:
		case <-ctx.Done():
		}
	}
	// The index record goes first: once the terminal report ends a leased
	// run's lease, its fenced store takes no more writes of it.
	stopIndex := p.timings.Start(timings.Index)
	writeIndex(ctx, p, indexRecord(p, t.wd, *tr.ex, tr.out, *tr.st))
	stopIndex()
	stopReport := p.timings.Start(timings.Report)
	perr := p.in.Updater.UpdateRunStatus(ctx, p.ref.RunID, tr.req)
	stopReport()
	p.log.Info("run finished", "status", tr.out.Status, "reason", tr.out.Reason, "exit_code", tr.out.Exit.ExitCode)
	if perr != nil {
		return fmt.Errorf("report %s: %w", tr.out.Status, perr)
	}
	return nil
}

// reportRunning sends the RUNNING PATCH in the background, so a slow
// control plane never delays supervising the container.
func (t *tracer) reportRunning(ctx context.Context, ex execution) <-chan struct{} {
	p, wd := t.p, t.wd
	done := make(chan struct{})
	req := &workerclient.PatchTaskRunRequest{
		Status:    model.StatusRunning,
		StartedAt: ptr(wd.started.UnixMilli()),
		Container: container(p, ex),
	}
	rec := indexRecord(p, wd, ex, nil, stored{})
	go func() {
		defer close(done)
		writeIndex(ctx, p, rec)
		if err := p.in.Updater.UpdateRunStatus(ctx, p.ref.RunID, req); err != nil {
			p.log.Warn("report RUNNING", "err", err)
		}
	}()
	return done
}

// journalUpdate writes a state change; a failed write is logged, returned
// and the change kept for the next one (the previous record stays intact).
func journalUpdate(p *plan, wd *workdir, change func(*journal.Record)) error {
	if wd == nil || wd.journal == nil {
		return nil
	}
	defer p.timings.Start(timings.Journal)()
	if err := wd.journal.Update(change); err != nil {
		p.log.Warn("journal the run", "err", err)
		return fmt.Errorf("journal the run: %w", err)
	}
	return nil
}

// journalVerdict records how the run ended, with its execution, before
// anything is stored: a retry or a recovery finishes the run from it. The
// container is still being removed meanwhile, so its removal stays pending
// until the collect phase ends.
func journalVerdict(p *plan, wd *workdir, v verdict, ex execution) error {
	judged, err := judgedState(v, ex)
	if err != nil {
		return err
	}
	return journalUpdate(p, wd, func(rec *journal.Record) {
		rec.Phase = journal.PhaseCollect
		rec.Status, rec.Reason = v.status, v.reason
		rec.Judged = judged
		rec.Pending = []journal.Pending{journal.PendingPersist, journal.PendingReport, journal.PendingRelease}
		if ex.ContainerID != "" {
			rec.Pending = append([]journal.Pending{journal.PendingContainer}, rec.Pending...)
		}
	})
}

// journalCollected records the collect phase's end: on failure the run is
// kept, holding no mount, for `taskrun persist`, which finishes it from
// this record; a kept run therefore fails with the journal's error.
func journalCollected(p *plan, wd *workdir, persistErr error) error {
	if persistErr == nil {
		_ = journalUpdate(p, wd, func(rec *journal.Record) {
			rec.Phase = journal.PhaseReport
			rec.Pending = []journal.Pending{journal.PendingReport}
		})
		return nil
	}
	return journalUpdate(p, wd, func(rec *journal.Record) {
		rec.Phase = journal.PhaseKept
		rec.Reason = joinReasons(rec.Reason, persistErr.Error())
		rec.Pending = []journal.Pending{journal.PendingPersist, journal.PendingReport}
		if rec.DiskCap != nil {
			rec.DiskCap.Mounted = false
		}
	})
}

// endJournal removes the record of a finished run, or closes it (keeping
// it) when the run is kept or its report is still owed.
func endJournal(p *plan, wd *workdir, keep bool) {
	if wd == nil || wd.journal == nil {
		return
	}
	defer p.timings.Start(timings.Journal)()
	var err error
	if keep {
		err = wd.journal.Close()
	} else {
		err = wd.journal.Remove()
	}
	if err != nil {
		p.log.Warn("end the run's journal record", "err", err)
	}
}
