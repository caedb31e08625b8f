// Package recovery finishes the runs that an executor left behind when it
// died (SIGKILL, a crash, a reboot) and keeps the runs whose persisting
// failed from holding host resources.
//
// For every journaled run (package journal) whose executor is gone — proven
// by the run's lock, which the executor holds for the whole run and the
// kernel releases when it dies — Recover:
//
//  1. stops the run's container and appends to the host spools what the
//     container printed after the executor stopped reading (from the
//     engine's capped json-file log), then removes the container;
//  2. calls Finish, which stores what the run left (spools, run dir), reports
//     FAILED with the reason "executor lost" when a control plane was
//     configured, and releases the run dir as a finished run would;
//  3. removes the journal record, or, when Finish failed (the store is
//     down), keeps the run: the disk cap is detached (no loop device or
//     mount stays) and the record moves to journal.PhaseKept with the reason,
//     for `taskrun persist --all` or a worker's background retry.
//
// Runs already kept are only checked to hold no container or mount. Recover
// never touches a run whose executor is alive.
package recovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
)

// ReasonExecutorLost is the reason reported for a run whose executor died.
const ReasonExecutorLost = "executor lost"

// Spool file names in a run's spool directory (journal.Record.SpoolDir).
const (
	StdoutSpoolName = "stdout.log"
	StderrSpoolName = "stderr.log"
)

// DefaultStopGrace is how long a recovered container gets between SIGTERM
// and SIGKILL.
const DefaultStopGrace = 5 * time.Second

// maxLogBytes bounds how much of a container's engine log recovery reads per
// stream (the engine's log is capped by the run's policy far below this).
const maxLogBytes = 256 << 20

// Containers is what recovery needs of the sandbox engine; the Docker
// backend (sandbox/docker.Backend) implements it.
type Containers interface {
	// OrphanExists reports whether the container still exists.
	OrphanExists(ctx context.Context, id string) (bool, error)
	// StopOrphan stops the container; one that is gone or stopped is fine.
	StopOrphan(ctx context.Context, id string, grace time.Duration) error
	// OrphanLogs copies the engine's log of the container's stdout and
	// stderr to the writers. An error wrapping sandbox.ErrContainerGone
	// means the container, and its log, went away (or the engine marked it
	// dead or for removal) since OrphanExists saw it.
	OrphanLogs(ctx context.Context, id string, stdout, stderr io.Writer) error
	// RemoveOrphan removes the container; one that is gone is fine.
	RemoveOrphan(ctx context.Context, id string) error
}

// FinishFunc stores what a recovered run left on the host (rec.SpoolDir and
// rec.RunDir, whose disk cap is still mounted), reports rec.Status and
// rec.Reason when a control plane was configured, and releases the run dir
// as a finished run would. It returns an error when storing failed: the run
// is then kept. A record in journal.PhaseReport was stored and released
// before its executor died: it keeps its verdict, and only its report is
// owed.
type FinishFunc func(ctx context.Context, rec journal.Record) error

// Recoverer recovers the runs of one journal.
type Recoverer struct {
	// Journal holds the runs' records.
	Journal *journal.Dir
	// Containers stops, reads and removes the runs' containers; nil when no
	// engine is reachable (runs with a container are then left alone).
	Containers Containers
	// Finish stores, reports and releases a recovered run.
	Finish FinishFunc
	// StopGrace is the containers' SIGTERM-to-SIGKILL grace;
	// DefaultStopGrace when zero.
	StopGrace time.Duration
	// Log receives what recovery does; slog.Default() when nil.
	Log *slog.Logger
}

// Action is what recovery did (or, in a dry run, would do) with a run.
type Action string

// Actions of a Result.
const (
	// ActionNone: the run's executor is alive; it was left alone.
	ActionNone Action = "none"
	// ActionRecovered: the run was stored, reported and released.
	ActionRecovered Action = "recovered"
	// ActionKept: the run is kept on the host for a persist retry.
	ActionKept Action = "kept"
	// ActionFailed: recovery could not finish; the record stays.
	ActionFailed Action = "failed"
)

// Result is one run's recovery.
type Result struct {
	// RunID is the run.
	RunID string `json:"run_id"`
	// Phase is the run's phase when found.
	Phase journal.Phase `json:"phase"`
	// Action is what was done, or would be done in a dry run.
	Action Action `json:"action"`
	// Why explains Action: why the run is kept, or left alone.
	Why string `json:"why"`
	// ContainerID is the run's container, if any.
	ContainerID string `json:"container_id,omitempty"`
	// RecoveredBytes counts the output bytes taken from the engine's log.
	RecoveredBytes int64 `json:"recovered_bytes,omitempty"`
	// Err is the error of a failed step.
	Err error `json:"-"`
}

// Recover recovers every run of the journal whose executor is gone; with
// dryRun it only says what it would do. Each run's failure is in its Result
// and joined into the returned error; one run never stops the others.
func (r *Recoverer) Recover(ctx context.Context, dryRun bool) ([]Result, error) {
	recs, listErr := r.Journal.List()
	var results []Result
	errs := []error{listErr}
	for _, rec := range recs {
		res := r.recoverOne(ctx, rec, dryRun)
		if res.Err != nil {
			errs = append(errs, fmt.Errorf("recover run %s: %w", rec.RunID, res.Err))
		}
		results = append(results, res)
	}
	return results, errors.Join(errs...)
}

func (r *Recoverer) log() *slog.Logger {
	if r.Log == nil {
		return slog.Default()
	}
	return r.Log
}

// recoverOne handles one record.
func (r *Recoverer) recoverOne(ctx context.Context, found *journal.Record, dryRun bool) Result {
	res := Result{RunID: found.RunID, Phase: found.Phase, ContainerID: found.ContainerID}
	held, err := r.Journal.Held(found.RunID)
	if err != nil {
		res.Action, res.Err = ActionFailed, err
		return res
	}
	if held {
		res.Action, res.Why = ActionNone, fmt.Sprintf("executor %s (pid %d) is running it", found.Executor.ID, found.Executor.PID)
		return res
	}
	if dryRun {
		if found.Phase == journal.PhaseKept {
			res.Action, res.Why = ActionKept, found.Reason
		} else {
			res.Action, res.Why = ActionRecovered, fmt.Sprintf("executor %s (pid %d) is gone", found.Executor.ID, found.Executor.PID)
		}
		return res
	}
	e, err := r.Journal.Claim(found.RunID)
	if errors.Is(err, journal.ErrBusy) {
		res.Action, res.Why = ActionNone, "another process took the run meanwhile"
		return res
	}
	if err != nil {
		res.Action, res.Err = ActionFailed, err
		return res
	}
	rec := e.Record()
	if rec.Phase == journal.PhaseKept {
		res.Action, res.Why = ActionKept, rec.Reason
		res.Err = r.releaseHold(ctx, e, &res)
		return res
	}
	r.log().Info("recovering a run whose executor is gone", "run", rec.RunID, "phase", rec.Phase, "executor", rec.Executor.ID, "pid", rec.Executor.PID)
	if err := r.settleContainer(ctx, e, &res); err != nil {
		res.Action, res.Err = ActionFailed, err
		_ = e.Close()
		return res
	}
	// A run journaled in the report phase had stored everything and
	// released its directory: its verdict stands and only its report is
	// owed, which Finish sends. Any other run is finished as FAILED.
	if rec.Phase != journal.PhaseReport {
		if err := e.Update(func(rec *journal.Record) {
			rec.Phase = journal.PhaseCollect
			rec.Status = model.StatusFailed
			rec.Reason = joinReasons(rec.Reason, ReasonExecutorLost)
		}); err != nil {
			r.log().Warn("journal the recovery", "run", rec.RunID, "err", err)
		}
	}
	if err := r.Finish(ctx, e.Record()); err != nil {
		res.Action, res.Why = ActionKept, err.Error()
		res.Err = errors.Join(err, r.keep(e, err))
		return res
	}
	res.Action, res.Why = ActionRecovered, fmt.Sprintf("executor %s (pid %d) was gone", rec.Executor.ID, rec.Executor.PID)
	if err := e.Remove(); err != nil {
		res.Err = err
	}
	return res
}

// settleContainer stops the run's container, saves the output it printed
// after the executor died into the spools and removes it.
func (r *Recoverer) settleContainer(ctx context.Context, e *journal.Entry, res *Result) error {
	rec := e.Record()
	if rec.ContainerID == "" {
		return nil
	}
	if r.Containers == nil {
		return fmt.Errorf("container %s: no container engine to stop it", rec.ContainerID)
	}
	exists, err := r.Containers.OrphanExists(ctx, rec.ContainerID)
	if err != nil {
		return err
	}
	if !exists {
		return nil // removed by its executor, or an earlier recovery
	}
	grace := r.StopGrace
	if grace <= 0 {
		grace = DefaultStopGrace
	}
	if err := r.Containers.StopOrphan(ctx, rec.ContainerID, grace); err != nil {
		return err
	}
	n, err := r.saveLogs(ctx, rec)
	res.RecoveredBytes = n
	if errors.Is(err, sandbox.ErrContainerGone) {
		// Its log went with it: the spools keep what the executor read.
		r.log().Warn("the container went away before its log was read; the spools keep what the executor read", "run", rec.RunID, "container", rec.ContainerID, "err", err)
		err = nil
	}
	if err != nil {
		// The container keeps the only copy of that output: leave it.
		return fmt.Errorf("save the output of container %s: %w", rec.ContainerID, err)
	}
	if err := r.Containers.RemoveOrphan(ctx, rec.ContainerID); err != nil {
		return err
	}
	return e.Update(func(rec *journal.Record) {
		rec.Pending = slices.DeleteFunc(rec.Pending, func(p journal.Pending) bool { return p == journal.PendingContainer })
	})
}

// saveLogs appends to each spool what the engine's log holds past it.
func (r *Recoverer) saveLogs(ctx context.Context, rec journal.Record) (int64, error) {
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = maxLogBytes, maxLogBytes
	if err := r.Containers.OrphanLogs(ctx, rec.ContainerID, &stdout, &stderr); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(rec.SpoolDir, 0o700); err != nil {
		return 0, err
	}
	var total int64
	for _, s := range []struct {
		name string
		log  []byte
	}{{StdoutSpoolName, stdout.Bytes()}, {StderrSpoolName, stderr.Bytes()}} {
		n, exact, err := appendMissing(filepath.Join(rec.SpoolDir, s.name), s.log, rec.MaxOutputBytes)
		total += n
		if err != nil {
			return total, err
		}
		if !exact {
			r.log().Warn("the engine's log no longer holds the start of the output; appended what follows the last match", "run", rec.RunID, "spool", s.name)
		}
	}
	return total, nil
}

// keep leaves a run whose storing failed on the host: no mount, a kept record.
func (r *Recoverer) keep(e *journal.Entry, cause error) error {
	rec := e.Record()
	var errs []error
	if err := diskcap.Detach(rec.RunDir); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, e.Update(func(rec *journal.Record) {
		rec.Phase = journal.PhaseKept
		rec.Reason = joinReasons(ReasonExecutorLost, cause.Error())
		if rec.DiskCap != nil {
			rec.DiskCap.Mounted = false
		}
		rec.Pending = []journal.Pending{journal.PendingPersist, journal.PendingReport}
	}))
	errs = append(errs, e.Close())
	r.log().Warn("run kept on the host for a persist retry", "run", rec.RunID, "dir", rec.RunDir, "err", cause)
	return errors.Join(errs...)
}

// releaseHold makes sure a kept run holds no container and no mount.
func (r *Recoverer) releaseHold(ctx context.Context, e *journal.Entry, res *Result) error {
	defer e.Close()
	if err := r.settleContainer(ctx, e, res); err != nil {
		return err
	}
	rec := e.Record()
	if err := diskcap.Detach(rec.RunDir); err != nil {
		return err
	}
	if rec.DiskCap != nil && rec.DiskCap.Mounted {
		return e.Update(func(rec *journal.Record) { rec.DiskCap.Mounted = false })
	}
	return nil
}

// appendMissing appends to the spool at path the part of log (the engine's
// copy of the same stream) that the spool lacks, keeping the spool within
// maxBytes (0: no cap). The spool is a prefix of the stream; log is the whole
// stream unless the engine rotated its head away. exact reports whether the
// spool's content was found at the start of log; otherwise the spool's tail
// is searched for in log and what follows its last occurrence is appended.
func appendMissing(path string, log []byte, maxBytes int64) (appended int64, exact bool, err error) {
	have, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, false, err
	}
	var missing []byte
	switch {
	case bytes.HasPrefix(log, have):
		missing, exact = log[len(have):], true
	case len(log) < len(have) && bytes.HasPrefix(have, log):
		return 0, true, nil // the spool has it all
	default:
		tail := have[max(0, len(have)-4096):]
		if i := bytes.LastIndex(log, tail); i >= 0 {
			missing = log[i+len(tail):]
		} else {
			missing = log
		}
	}
	if maxBytes > 0 {
		missing = missing[:min(int64(len(missing)), max(0, maxBytes-int64(len(have))))]
	}
	if len(missing) == 0 {
		return 0, exact, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return 0, exact, err
	}
	n, err := f.Write(missing)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return int64(n), exact, err
}

// limitedBuffer keeps the first max bytes written and drops the rest.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

// Write implements io.Writer.
func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// joinReasons joins the non-empty reasons with "; ", once each.
func joinReasons(reasons ...string) string {
	var out []string
	for _, r := range reasons {
		if r != "" && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return strings.Join(out, "; ")
}
