package executor_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// withoutRunning splits off the RUNNING report, which the live audit sends
// in the background once the agent is let go: it is asserted to lie after
// the prestart hooks and before the exited ones. A run cancelled while its
// container started may have none (optional).
func withoutRunning(t *testing.T, steps []string, optional ...bool) []string {
	t.Helper()
	i := slices.Index(steps, "running")
	if i < 0 && len(optional) > 0 && optional[0] {
		return steps
	}
	require.GreaterOrEqual(t, i, 0, "RUNNING was traced: %v", steps)
	assert.Greater(t, i, slices.Index(steps, "prestart:gateway"), "RUNNING after the prestart hooks: %v", steps)
	assert.Less(t, i, slices.Index(steps, "exited:gateway"), "RUNNING before the exited hooks: %v", steps)
	return slices.Delete(slices.Clone(steps), i, i+1)
}

// The order of every side effect of a run, as traced, for each way a run
// can go: the ordering is a crash-safety property (the journal must say
// what exists before it is released), pinned here rather than by the
// order of lines in the runner.
func TestTracedOrderOfARun(t *testing.T) {
	// A cold run: uid and run dir, the create ahead while the run dir is
	// prepared, the container, its removal started as soon as it exited,
	// the verdict journaled before anything is stored, the local copy kept
	// before any upload, the agent's files stored (beside the records) and
	// then sealed (collection record, attestation), the container's removal
	// awaited before the journal lets go of it and before the uid and run
	// dir are released, and the final report before the journal record
	// goes.
	// The live audit (poststart:isolation) is started beside the
	// container before the start is journaled; the self-check's report is
	// read (exited:isolation) before the output's spools close.
	started := []string{
		"prestart:uid", "prestart:rundir", "create", "prestart:dirs", "prestart:isolation", "prestart:workspace", "prestart:changes", "prestart:output", "prestart:gateway",
		"poststart:isolation", "started", "poststart:output", "poststart:metrics",
		"exited:isolation", "exited:output", "exited:gateway", "exited:metrics", "remove", "judged",
		"keep", "collect:files", "seal:files", "removed", "collected",
		"stop:gateway", "stop:output", "stop:rundir", "stop:uid", "reported", "ended",
	}
	t.Run("cold", func(t *testing.T) {
		u := newUnit(t)
		steps := &runtest.StepLog{}
		in := u.input("trace-cold", func(_ context.Context, p *sandboxfake.Process) int {
			write(p.Stdout, "done")
			return 0
		})
		in.Logger = slog.New(steps)
		_, err := executor.Execute(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, started, withoutRunning(t, steps.Take()))
	})
	t.Run("failed", func(t *testing.T) {
		u := newUnit(t)
		steps := &runtest.StepLog{}
		in := u.input("trace-failed", func(context.Context, *sandboxfake.Process) int { return 3 })
		in.Logger = slog.New(steps)
		_, err := executor.Execute(context.Background(), in)
		require.ErrorIs(t, err, executor.ErrRunFailed)
		assert.Equal(t, started, withoutRunning(t, steps.Take()))
	})
	t.Run("cancelled", func(t *testing.T) {
		u := newUnit(t)
		steps := &runtest.StepLog{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		in := u.input("trace-cancel", func(ctx context.Context, p *sandboxfake.Process) int {
			cancel()
			<-ctx.Done()
			return 137
		})
		in.Logger = slog.New(steps)
		out, err := executor.Execute(ctx, in)
		require.ErrorIs(t, err, executor.ErrRunFailed)
		assert.Equal(t, model.StatusCancelled, out.Status)
		assert.Equal(t, started, withoutRunning(t, steps.Take(), true))
	})
	t.Run("not started", func(t *testing.T) {
		// No container: nothing is journaled as started, reported RUNNING,
		// kept, stored or removed; the later events all still happen.
		u := newUnit(t, sandboxfake.WithStartError(errors.New("no space left on device")))
		steps := &runtest.StepLog{}
		in := u.input("trace-nostart", nil)
		in.Logger = slog.New(steps)
		_, err := executor.Execute(context.Background(), in)
		require.ErrorIs(t, err, sandboxfake.ErrStart)
		assert.Equal(t, []string{
			"prestart:uid", "prestart:rundir", "create", "prestart:dirs", "prestart:isolation", "prestart:workspace", "prestart:changes", "prestart:output", "prestart:gateway",
			"exited:isolation", "exited:output", "exited:gateway", "exited:metrics", "judged", "collected",
			"stop:gateway", "stop:output", "stop:rundir", "stop:uid", "reported", "ended",
		}, steps.Take())
	})
	t.Run("kept then recovered", func(t *testing.T) {
		// The store is down: the run is kept (collected, released as a
		// kept copy, reported, its journal record closed); RetryPersist
		// stores it, then reports, then ends the record.
		u := newUnit(t)
		steps := &runtest.StepLog{}
		in := u.input("trace-kept", func(_ context.Context, p *sandboxfake.Process) int {
			write(p.Stdout, "precious")
			return 0
		})
		in.Persist = downStore{u.store}
		in.Logger = slog.New(steps)
		_, err := executor.Execute(context.Background(), in)
		require.ErrorIs(t, err, executor.ErrRunFailed)
		assert.Equal(t, started, withoutRunning(t, steps.Take()))
		assert.DirExists(t, u.runDir("trace-kept"))

		retry := u.input("trace-kept", nil)
		retry.Sandbox = nil
		retry.Logger = slog.New(steps)
		_, err = executor.RetryPersist(context.Background(), retry)
		require.NoError(t, err)
		assert.Equal(t, []string{"keep", "collect:files", "seal:files", "collected", "reported", "ended"}, steps.Take())
		assert.Equal(t, "precious", u.runFile(t, "trace-kept", executor.OutputLogName))
		assert.NoDirExists(t, u.runDir("trace-kept"))
	})
	t.Run("recovered", func(t *testing.T) {
		// The executor died while its container ran: recovery keeps what
		// the run left, stores it, reports the run FAILED, then lets go of
		// it. A run that died after everything was stored is only reported.
		u := newUnit(t)
		rec := deadExecutorRecord(t, u, "trace-lost", journal.PhaseSupervise)
		steps := &runtest.StepLog{}
		in := u.input("trace-lost", nil)
		in.Sandbox, in.Logger = nil, slog.New(steps)
		out, err := executor.RecoverRun(context.Background(), in, rec)
		require.NoError(t, err)
		assert.Equal(t, model.StatusFailed, out.Status)
		assert.Equal(t, []string{"keep", "collect:files", "seal:files", "collected", "reported", "ended"}, steps.Take())
		assert.Equal(t, "the lost run's output", u.runFile(t, "trace-lost", executor.OutputLogName))
		assert.NoDirExists(t, u.runDir("trace-lost"))

		rec = deadExecutorRecord(t, u, "trace-unreported", journal.PhaseReport)
		in = u.input("trace-unreported", nil)
		in.Sandbox, in.Logger = nil, slog.New(steps)
		_, err = executor.RecoverRun(context.Background(), in, rec)
		require.NoError(t, err)
		assert.Equal(t, []string{"reported"}, steps.Take())
	})
}

// deadExecutorRecord lays out what an executor that died in phase left of
// run runID on u's host, its run dir and spool, and returns the run's
// journal record.
func deadExecutorRecord(t *testing.T, u *unit, runID string, phase journal.Phase) journal.Record {
	t.Helper()
	dir := u.runDir(runID)
	for _, sub := range []string{"home", "artifacts", "global", "output"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, sub), 0o755))
	}
	spool := dir + ".executor"
	require.NoError(t, os.MkdirAll(spool, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(spool, "stdout.log"), []byte("the lost run's output"), 0o600))
	return journal.Record{
		RunID: runID, UserID: "user1", ConversationID: "conv1", TaskID: "task1", SessionID: "s1",
		RunDir: dir, SpoolDir: spool, Phase: phase, ContainerID: "the-dead-executors-container",
		StartedAt: time.Now().Add(-time.Minute), UpdatedAt: time.Now(),
	}
}
