package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// legacyKeptName is the file a Version 1 executor kept a run's verdict and
// execution in, beside its spools.
const legacyKeptName = "run.json"

// keptRun runs runID with the store down: the agent writes "kept" and
// exits with code 4, and the run is kept on the host. It returns the run's
// journal record.
func keptRun(t *testing.T, u *unit, runID string) (*journal.Dir, *journal.Record) {
	t.Helper()
	in := u.input(runID, func(_ context.Context, p *sandboxfake.Process) int {
		write(p.Stdout, "kept")
		return 4
	})
	in.Persist = downStore{u.store}
	_, err := executor.Execute(context.Background(), in)
	require.ErrorIs(t, err, executor.ErrRunFailed)
	jd, err := executor.OpenRunJournal(u.root)
	require.NoError(t, err)
	rec, err := jd.Load(runID)
	require.NoError(t, err)
	require.Equal(t, journal.PhaseKept, rec.Phase)
	return jd, rec
}

// A kept run's one state is its journal record: the verdict and the
// execution are in it, nothing else is written beside the spools, and
// RetryPersist reports the run's own verdict and exit code from it.
func TestPhasesKeptRunStateIsTheJournalRecord(t *testing.T) {
	u := newUnit(t)
	_, rec := keptRun(t, u, "state1")
	assert.Equal(t, journal.Version, rec.Version)
	require.NotNil(t, rec.Judged, "the judged state is journaled")
	assert.Equal(t, model.StatusFailed, rec.Judged.Status)
	assert.Equal(t, "agent exited with code 4", rec.Judged.Reason)
	assert.Contains(t, rec.Reason, "connection refused", "the record's reason names the failed upload")
	var ex struct {
		ContainerID string `json:"container_id"`
		Exit        struct {
			ExitCode int `json:"exit_code"`
		} `json:"exit"`
	}
	require.NoError(t, json.Unmarshal(rec.Judged.Execution, &ex))
	assert.Equal(t, 4, ex.Exit.ExitCode)
	assert.Equal(t, rec.ContainerID, ex.ContainerID)
	assert.NoFileExists(t, filepath.Join(rec.SpoolDir, legacyKeptName))

	retry := u.input("state1", nil)
	retry.Sandbox = nil
	out, err := executor.RetryPersist(context.Background(), retry)
	require.ErrorIs(t, err, executor.ErrRunFailed)
	assert.Equal(t, "agent exited with code 4", out.Reason, "the verdict as judged, not the record's")
	assert.Equal(t, rec.ContainerID, out.ContainerID)
	assert.Equal(t, 4, out.Exit.ExitCode)
	require.NotNil(t, u.final(t).ExitCode)
	assert.Equal(t, 4, *u.final(t).ExitCode)
	assert.Equal(t, "kept", u.runFile(t, "state1", executor.OutputLogName))
}

// A run kept by a Version 1 executor has no judged state in its record:
// its verdict and execution are read from the run.json it kept.
func TestPhasesVersion1KeptRunIsRetriedFromRunJSON(t *testing.T) {
	u := newUnit(t)
	jd, rec := keptRun(t, u, "legacy1")
	rec.Version, rec.Judged = 1, nil
	data, err := json.Marshal(rec)
	require.NoError(t, err)
	require.NoError(t, journal.WriteFileAtomic(filepath.Join(jd.Path(), "legacy1.json"), data, 0o600))
	legacy, err := json.Marshal(map[string]any{
		"execution":  map[string]any{"container_id": rec.ContainerID, "exit": map[string]any{"exit_code": 7}, "stream_ended": true},
		"status":     model.StatusFailed,
		"reason":     "agent exited with code 7",
		"started_at": rec.StartedAt,
	})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(rec.SpoolDir, legacyKeptName), legacy, 0o600))

	retry := u.input("legacy1", nil)
	retry.Sandbox = nil
	out, err := executor.RetryPersist(context.Background(), retry)
	require.ErrorIs(t, err, executor.ErrRunFailed)
	assert.Equal(t, "agent exited with code 7", out.Reason)
	require.NotNil(t, u.final(t).ExitCode)
	assert.Equal(t, 7, *u.final(t).ExitCode)
	assert.NoDirExists(t, u.runDir("legacy1"))
}

// The journal record is the only copy of a kept run's verdict and
// execution: when the journal refuses the writes that hold them, the run
// says so rather than leaving a kept copy that would be retried without
// them.
func TestPhasesKeptRunFailsWhenTheJournalRefusesItsState(t *testing.T) {
	u := newUnit(t)
	in := u.input("nojournal1", func(_ context.Context, p *sandboxfake.Process) int {
		write(p.Stdout, "kept")
		// The journal's directory goes away: every later write fails. A
		// write in flight (the started state's) can make one removal fail.
		dir := filepath.Join(u.root, executor.JournalDirName)
		for range 1000 {
			if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
				break
			}
			_ = os.RemoveAll(dir)
			time.Sleep(time.Millisecond)
		}
		return 4
	})
	in.Persist = downStore{u.store}
	out, err := executor.Execute(context.Background(), in)
	require.NoDirExists(t, filepath.Join(u.root, executor.JournalDirName))
	require.ErrorIs(t, err, executor.ErrRunFailed)
	require.ErrorIs(t, err, fs.ErrNotExist, "the journal's failure is the run's")
	assert.Contains(t, out.Reason, "journal the run")
}

// An executor that died after judging its run left the verdict and the
// execution in the journal record: recovery reports them, not a lost run.
func TestPhasesRecoveryReportsTheJournaledExecution(t *testing.T) {
	u := newUnit(t)
	rec := deadExecutorRecord(t, u, "judged-lost", journal.PhaseCollect)
	rec.Version, rec.Status, rec.Reason = journal.Version, model.StatusFailed, "agent exited with code 4"
	rec.Judged = &journal.Judged{
		Status: model.StatusFailed, Reason: "agent exited with code 4", EndedAt: time.Now(),
		Execution: json.RawMessage(`{"container_id":"the-dead-executors-container","exit":{"exit_code":4},"stream_ended":true}`),
	}
	in := u.input("judged-lost", nil)
	in.Sandbox = nil
	out, err := executor.RecoverRun(context.Background(), in, rec)
	require.NoError(t, err)
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.Equal(t, "agent exited with code 4", out.Reason)
	assert.Equal(t, 4, out.Exit.ExitCode)
	require.NotNil(t, u.final(t).ExitCode)
	assert.Equal(t, 4, *u.final(t).ExitCode)
	assert.Equal(t, "the lost run's output", u.runFile(t, "judged-lost", executor.OutputLogName))
	assert.NoDirExists(t, u.runDir("judged-lost"))
}
