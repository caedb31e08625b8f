package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
)

// ErrNothingKept is returned by RetryPersist for a run that has no kept
// local copy: it was persisted already, or never ran on this host.
var ErrNothingKept = errors.New("no kept local copy of the run")

// keptRun is what RetryPersist needs to finish a run as execute would have:
// what supervise observed, the verdict before persisting, and the input that
// shapes persisting. It comes from the run's journal record (its Judged
// state); a Version 1 record left it in legacyKeptName beside the spools,
// in this JSON form.
type keptRun struct {
	Execution       execution       `json:"execution"`
	Status          model.RunStatus `json:"status"`
	Reason          string          `json:"reason,omitempty"`
	RunError        string          `json:"run_error,omitempty"`
	EndedAt         time.Time       `json:"ended_at"`
	StartedAt       time.Time       `json:"started_at"`
	SessionExcludes []string        `json:"session_excludes"`
	KeepRunDir      bool            `json:"keep_run_dir,omitempty"`
}

// judgedState is the journal's Judged state of a run judged v whose
// execution was ex.
func judgedState(v verdict, ex execution) (*journal.Judged, error) {
	exec, err := json.Marshal(ex)
	if err != nil {
		return nil, fmt.Errorf("journal the run's execution: %w", err)
	}
	j := &journal.Judged{Status: v.status, Reason: v.reason, EndedAt: v.ended, Execution: exec}
	if v.err != nil {
		j.RunError = v.err.Error()
	}
	return j, nil
}

// keepLocalState writes the isolation record next to the spools, before
// anything is uploaded, so that a failed upload can be retried from the
// host alone (the verdict and the execution are in the journal record,
// written when the run was judged).
func keepLocalState(p *plan, wd *workdir, ex execution) error {
	if ex.isolation == nil {
		return nil
	}
	rec, err := json.MarshalIndent(ex.isolation, "", "  ")
	if err != nil {
		return err
	}
	if int64(len(rec)) > wd.isolationRoom && wd.records != nil {
		rec = fmt.Appendf(nil, "{\"error\":\"the isolation record of %d bytes is over its %d-byte room in the run's record budget\"}\n", len(rec), wd.isolationRoom)
	}
	return journal.WriteFileAtomic(filepath.Join(p.hostDir, AuditRecordName), rec, 0o600)
}

// retryPersist finishes a run whose persistence failed: it uploads the
// local copy execute kept (output logs, trace, artifacts, output files,
// session state, isolation record), removes it once everything is stored,
// and reports the run's final status again through input.Updater, with the
// verdict execute reached before persisting. input names the same run as the
// failed execute (same IDs, session and Paths); the session excludes and
// KeepRunDir of the original run apply; Sandbox, Image and Model are unused.
// A journaled run is taken over from the journal (while a live process holds
// it the error wraps journal.ErrBusy); a run whose executor died before
// collecting is finished from its journal record, as FAILED.
func retryPersist(ctx context.Context, input runInput) (*Outcome, error) {
	p, err := newPlan(input)
	if err != nil {
		return nil, err
	}
	entry, err := claimJournal(p)
	if err != nil {
		return nil, err
	}
	var rec *journal.Record
	if entry != nil {
		r := entry.Record()
		rec = &r
		p.adoptJournaledDirs(r)
	}
	kept, err := loadKept(p, rec)
	if err != nil {
		if entry != nil {
			_ = entry.Close()
		}
		return nil, err
	}
	r, v := keptRunner(p, kept, entry)
	out, err, _, _ := r.finishKept(ctx, kept.Execution, v)
	return out, err
}

// recoverRun finishes a run whose executor died, from its journal record
// (see recovery.FinishFunc): it stores what the run left on the host,
// reports rec.Status and rec.Reason (FAILED, "executor lost" when the
// executor died before its verdict) and releases the run dir. input names
// the run as RetryPersist's does; the record itself is the caller's to keep
// or remove. The error is storing's or reporting's, not the run's own
// failure.
func recoverRun(ctx context.Context, input runInput, rec journal.Record) (*Outcome, error) {
	p, err := newPlan(input)
	if err != nil {
		return nil, err
	}
	p.adoptJournaledDirs(rec)
	if p.dirs.Dir != rec.RunDir {
		return nil, fmt.Errorf("%w: run %s was journaled at %s, not %s; pass the --root it ran with", ErrInvalidInput, rec.RunID, rec.RunDir, p.dirs.Dir)
	}
	kept, err := loadKept(p, &rec)
	if err != nil {
		return nil, err
	}
	kept.Status, kept.Reason = recordVerdict(rec)
	r, v := keptRunner(p, kept, nil)
	if rec.Phase == journal.PhaseReport {
		// Everything was stored and released: only the report is owed.
		out, err := r.report(ctx, kept.Execution, v, stored{}, nil)
		if reportFailed(err) {
			return out, err
		}
		return out, nil
	}
	out, _, persistErr, reportErr := r.finishKept(ctx, kept.Execution, v)
	return out, errors.Join(persistErr, reportErr)
}

// recordVerdict is a journaled run's status and reason: its verdict, or
// FAILED when its executor died before reaching one.
func recordVerdict(rec journal.Record) (model.RunStatus, string) {
	if rec.Status == "" || rec.Status == model.StatusRunning {
		return model.StatusFailed, rec.Reason
	}
	return rec.Status, rec.Reason
}

// keptFromRecord is the kept run of a journal record that holds no verdict
// and execution: the executor died before judging the run.
func keptFromRecord(rec journal.Record) keptRun {
	status, reason := recordVerdict(rec)
	return keptRun{
		Execution: execution{ContainerID: rec.ContainerID, Exit: sandbox.Result{ExitCode: -1}},
		Status:    status, Reason: reason, RunError: reason, EndedAt: rec.UpdatedAt,
		StartedAt: rec.StartedAt, SessionExcludes: rec.SessionExcludes, KeepRunDir: rec.KeepRunDir,
	}
}

// loadKept is what finishing the run needs, from its journal record rec
// (nil: the run has none): the verdict and execution it was judged with,
// or what the record alone says when the executor died before judging it.
// A Version 1 record kept them in legacyKeptName instead, which is read
// when present.
func loadKept(p *plan, rec *journal.Record) (keptRun, error) {
	if rec != nil && rec.Judged != nil {
		return keptFromJudged(*rec)
	}
	kept, err := loadLegacyKept(p)
	if errors.Is(err, ErrNothingKept) && rec != nil {
		return keptFromRecord(*rec), nil
	}
	return kept, err
}

// keptFromJudged is the kept run of a journal record that holds the run's
// Judged state.
func keptFromJudged(rec journal.Record) (keptRun, error) {
	j := rec.Judged
	kept := keptRun{
		Status: j.Status, Reason: j.Reason, RunError: j.RunError, EndedAt: j.EndedAt,
		StartedAt: rec.StartedAt, SessionExcludes: rec.SessionExcludes, KeepRunDir: rec.KeepRunDir,
	}
	if err := json.Unmarshal(j.Execution, &kept.Execution); err != nil {
		return kept, fmt.Errorf("read the journaled execution of run %s: %w", rec.RunID, err)
	}
	return kept, nil
}

// loadLegacyKept reads the legacyKeptName a Version 1 executor kept before
// persisting.
func loadLegacyKept(p *plan) (keptRun, error) {
	var kept keptRun
	data, err := os.ReadFile(filepath.Join(p.hostDir, legacyKeptName))
	if errors.Is(err, os.ErrNotExist) {
		return kept, fmt.Errorf("%w: run %s has no journal record and no %s under %s", ErrNothingKept, p.ref.RunID, legacyKeptName, p.hostDir)
	}
	if err != nil {
		return kept, err
	}
	if err := json.Unmarshal(data, &kept); err != nil {
		return kept, fmt.Errorf("read kept run %s: %w", p.ref.RunID, err)
	}
	return kept, nil
}

// keptHooks are the hooks that store records of a kept run (RetryPersist,
// recoverRun) from its local copy; each stores only what exists.
func keptHooks(p *plan, wd *workdir) []hook {
	return []hook{&selfCheckHook{p: p}, &changesHook{p: p}, &outputHook{p: p}, &gatewayHook{p: p}, &egressHook{p: p}, &filesHook{p: p, wd: wd}}
}

// keptRunner is the runner a kept run is finished with, over the kept
// hooks, journaling in entry when there is one, and the verdict it reached:
// the original run's choices apply, not this call's.
func keptRunner(p *plan, kept keptRun, entry *journal.Entry) (*runner, verdict) {
	retry := *p
	retry.sessionExcludes, retry.keepRunDir = kept.SessionExcludes, kept.KeepRunDir
	wd := &workdir{started: kept.StartedAt, owned: true, journal: entry} // the kept copy is this run's
	v := verdict{status: kept.Status, reason: kept.Reason, ended: kept.EndedAt}
	if kept.RunError != "" {
		v.err = errors.New(kept.RunError)
	}
	return &runner{p: &retry, wd: wd, tr: &tracer{p: &retry, wd: wd}, hooks: keptHooks(&retry, wd), createAt: -1}, v
}

// finishKept collects, releases and reports a kept run whose execution
// was ex and verdict v.
func (r *runner) finishKept(ctx context.Context, ex execution, v verdict) (out *Outcome, err, persistErr, reportErr error) {
	p, wd, tr := r.p, r.wd, r.tr
	if diskcap.HasImage(p.dirs.Dir) {
		// A kept image waits unmounted: mount it (read-only) to read it.
		release, err := diskcap.Reattach(ctx, p.dirs.Dir)
		if err != nil {
			tr.trace(ctx, transition{state: stateEnded, keep: true})
			return nil, fmt.Errorf("reattach the kept run directory: %w", err), err, nil
		}
		wd.unmount = release
	}
	// Storing has the deadline it had at the end of the run, and is never
	// left holding the mount: when it passes, or ctx is cancelled (the
	// first SIGINT or SIGTERM of `taskrun persist`), collect returns and
	// release unmounts the image before anything else.
	collectCtx, cancelCollect := context.WithTimeout(ctx, deadline(p.in.PersistTimeout, DefaultPersistTimeout))
	st, persistErr := r.keepAndCollect(collectCtx, ex, v)
	cancelCollect()
	persistErr = errors.Join(persistErr, tr.trace(ctx, transition{state: stateCollected, persistErr: persistErr}))
	finishStream(ctx, p, wd, ex)
	releaseDir(p, wd, persistErr, true)
	out, err = r.report(ctx, ex, v, st, persistErr)
	if reportFailed(err) {
		reportErr = err
	}
	tr.trace(ctx, transition{state: stateEnded, keep: persistErr != nil || reportErr != nil})
	return out, err, persistErr, reportErr
}
