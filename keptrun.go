package taskrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/model"
)

// ErrNothingKept is returned by RetryPersist for a run that has no kept
// local copy: it was persisted already, or never ran on this host.
var ErrNothingKept = errors.New("no kept local copy of the run")

// keptRun is what RetryPersist needs to finish a run as RunTask would have:
// what supervise observed, the verdict before persisting, and the input that
// shapes persisting.
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

// keepLocalState writes the execution, the verdict and the isolation record
// next to the spools, before anything is uploaded, so that a failed upload
// can be retried from the host alone.
func keepLocalState(p *plan, wd *workdir, ex execution, v verdict) error {
	kept := keptRun{
		Execution: ex, Status: v.status, Reason: v.reason, EndedAt: v.ended,
		StartedAt: wd.started, SessionExcludes: p.sessionExcludes, KeepRunDir: p.keepRunDir,
	}
	if v.err != nil {
		kept.RunError = v.err.Error()
	}
	data, err := json.Marshal(kept)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.hostDir, keptRunName), data, 0o600); err != nil {
		return err
	}
	if ex.record != nil {
		return os.WriteFile(filepath.Join(p.hostDir, AuditRecordName), ex.record, 0o600)
	}
	return nil
}

// RetryPersist finishes a run whose persistence failed: it uploads the
// local copy RunTask kept (output logs, trace, artifacts, output files,
// session state, isolation record), removes it once everything is stored,
// and reports the run's final status again through input.Updater, with the
// verdict RunTask reached before persisting. input names the same run as the
// failed RunTask (same IDs, session and Paths); the session excludes and
// KeepRunDir of the original run apply; Sandbox, Image and Model are unused.
func RetryPersist(ctx context.Context, input RunTaskInput) (*Outcome, error) {
	p, err := newPlan(input)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(p.hostDir, keptRunName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: run %s has no %s under %s", ErrNothingKept, p.ref.RunID, keptRunName, p.hostDir)
	}
	if err != nil {
		return nil, err
	}
	var kept keptRun
	if err := json.Unmarshal(data, &kept); err != nil {
		return nil, fmt.Errorf("read kept run %s: %w", p.ref.RunID, err)
	}
	// The original run's choices apply, not this call's.
	retry := *p
	retry.sessionExcludes, retry.keepRunDir = kept.SessionExcludes, kept.KeepRunDir
	wd := &workdir{
		started: kept.StartedAt,
		owned:   true, // the kept copy is this run's
		unmount: func() error { return diskcap.Release(p.dirs.Dir) },
	}
	v := verdict{status: kept.Status, reason: kept.Reason, ended: kept.EndedAt}
	if kept.RunError != "" {
		v.err = errors.New(kept.RunError)
	}
	st, persistErr := collect(ctx, &retry, wd, kept.Execution, v)
	release(&retry, wd, persistErr)
	return report(ctx, &retry, wd, kept.Execution, v, st, persistErr)
}
