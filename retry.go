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
)

// Executor-private files that let a run whose persistence failed be
// persisted later by RetryPersist.
const (
	keptRunName    = "run.json"
	keptRecordName = "audit.json"
)

// ErrNothingKept is returned by RetryPersist for a run that has no kept
// local copy: it was persisted already, or never ran on this host.
var ErrNothingKept = errors.New("no kept local copy of the run")

// keptRun is what RetryPersist needs to finish a run as RunTask would have:
// its outcome and verdict before persisting, why it failed, if it did, and
// the input that shapes persisting.
type keptRun struct {
	Outcome         Outcome   `json:"outcome"`
	RunError        string    `json:"run_error,omitempty"`
	StartedAt       time.Time `json:"started_at"`
	SessionExcludes []string  `json:"session_excludes,omitempty"`
	KeepRunDir      bool      `json:"keep_run_dir,omitempty"`
}

// keepLocalState writes the run's outcome and isolation record next to the
// spools, before anything is uploaded, so that a failed upload can be retried
// from the host alone.
func (r *runner) keepLocalState(runErr error) error {
	kept := keptRun{Outcome: r.out, StartedAt: r.started, SessionExcludes: r.in.SessionExcludes, KeepRunDir: r.in.KeepRunDir}
	if runErr != nil {
		kept.RunError = runErr.Error()
	}
	data, err := json.Marshal(kept)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.hostDir, keptRunName), data, 0o600); err != nil {
		return err
	}
	if rec := r.isolationRecord(); rec != nil {
		return os.WriteFile(filepath.Join(r.hostDir, keptRecordName), rec, 0o600)
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
	r, err := newRunner(input)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(r.hostDir, keptRunName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: run %s has no %s under %s", ErrNothingKept, r.ref.RunID, keptRunName, r.hostDir)
	}
	if err != nil {
		return nil, err
	}
	var kept keptRun
	if err := json.Unmarshal(data, &kept); err != nil {
		return nil, fmt.Errorf("read kept run %s: %w", r.ref.RunID, err)
	}
	r.out, r.started = kept.Outcome, kept.StartedAt
	r.in.SessionExcludes, r.in.KeepRunDir = kept.SessionExcludes, kept.KeepRunDir
	var runErr error
	if kept.RunError != "" {
		runErr = errors.New(kept.RunError)
	}
	r.ownsRunDir = true // the kept copy is this run's
	r.unmountDisk = func() error { return diskcap.Release(r.dirs.Dir) }
	persistErr := r.persist(ctx, runErr)
	r.releaseLocal(persistErr)
	return r.report(ctx, runErr, persistErr)
}
