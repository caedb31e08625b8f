package recovery_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/recovery"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/spool"
)

const testImage = "taskrun/testbox:local"

// printer prints numbered lines until stopped.
var printer = []string{"sh", "-c", `i=0; while true; do echo "line $i"; i=$((i+1)); sleep 0.01; done`}

// fixture is a run as an executor leaves it when it dies mid-run: a
// journaled record, a running container, a spool holding a prefix of its
// output and a mounted disk cap.
type fixture struct {
	journal *journal.Dir
	backend *docker.Backend
	entry   *journal.Entry
	rec     journal.Record
	handle  sandbox.Handle
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := t.Context()
	root := t.TempDir()
	jd, err := journal.Open(filepath.Join(root, "journal"))
	require.NoError(t, err)
	b, err := docker.New(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })

	runID := "r" + strings.ToLower(instance.NewID())
	runDir := filepath.Join(root, "runs", runID)
	spoolDir := runDir + ".executor"
	require.NoError(t, os.MkdirAll(runDir, 0o755))
	require.NoError(t, os.MkdirAll(spoolDir, 0o700))
	var dc *journal.DiskCap
	if _, err := diskcap.Mount(ctx, runDir, 16<<20); err == nil {
		dc = &journal.DiskCap{Image: diskcap.ImagePath(runDir), Mount: runDir, Mounted: true}
		t.Cleanup(func() { _ = diskcap.Release(runDir) })
	} else if !errors.Is(err, diskcap.ErrUnsupported) {
		require.NoError(t, err)
	}
	require.NoError(t, os.WriteFile(filepath.Join(runDir, "result.md"), []byte("partial"), 0o644))

	self, err := instance.Self()
	require.NoError(t, err)
	self.ID = instance.NewID()
	e, err := jd.Create(journal.Record{
		RunID: runID, UserID: "u", ConversationID: "c", TaskID: "t", SessionID: "s",
		Executor: self, RunDir: runDir, SpoolDir: spoolDir, DiskCap: dc,
		Store: "file:///nowhere", Phase: journal.PhasePrepare,
	})
	require.NoError(t, err)

	out, err := spool.New(filepath.Join(spoolDir, recovery.StdoutSpoolName))
	require.NoError(t, err)
	h, err := b.Start(ctx, sandbox.Spec{Image: testImage, Cmd: printer, Run: model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: runID},
		Labels: map[string]string{"dev.taskrun.test": runID}}, sandbox.DefaultPolicy(), sandbox.Streams{Stdout: out})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	require.NoError(t, e.Update(func(r *journal.Record) { r.Phase = journal.PhaseSupervise; r.ContainerID = h.ID() }))

	// Let some lines reach the spool, then stop reading as a dead executor
	// would: the container prints on, into the engine's log only.
	require.Eventually(t, func() bool { return out.Size() > 200 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, out.Close())
	return &fixture{journal: jd, backend: b, entry: e, rec: e.Record(), handle: h}
}

// die releases the run's lock, as the kernel does when the executor dies.
func (f *fixture) die(t *testing.T) {
	require.NoError(t, f.entry.Close())
}

// requireWholeOutput checks the spool holds "line 0" to "line N" once each,
// in order, and more than the spool had when the executor died.
func requireWholeOutput(t *testing.T, path string, min int) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	require.Greater(t, len(lines), min)
	for i, l := range lines {
		require.Equal(t, fmt.Sprintf("line %d", i), l, "line %d of the recovered output", i)
	}
}

func TestRecoverStoresEverythingAndReleases(t *testing.T) {
	f := newFixture(t)
	before, err := os.ReadFile(filepath.Join(f.rec.SpoolDir, recovery.StdoutSpoolName))
	require.NoError(t, err)
	// The container keeps printing after the executor stopped reading: wait
	// until the engine's log holds more than the spool did.
	want := strings.Count(string(before), "\n") + 2
	require.Eventually(t, func() bool {
		logs, err := exec.Command("docker", "logs", f.handle.ID()).Output()
		return err == nil && bytes.Count(logs, []byte("\n")) >= want
	}, testdeadline.Scale(time.Minute), 50*time.Millisecond, "the container printed on into the engine's log")
	f.die(t)

	var finished []journal.Record
	r := &recovery.Recoverer{
		Journal:    f.journal,
		Containers: f.backend,
		StopGrace:  time.Second,
		Finish: func(ctx context.Context, rec journal.Record) error {
			finished = append(finished, rec)
			// What Finish stores is whole: the spool and the mounted run dir.
			requireWholeOutput(t, filepath.Join(rec.SpoolDir, recovery.StdoutSpoolName), strings.Count(string(before), "\n"))
			data, err := os.ReadFile(filepath.Join(rec.RunDir, "result.md"))
			require.NoError(t, err)
			assert.Equal(t, "partial", string(data))
			return diskcap.Release(rec.RunDir)
		},
	}
	dry, err := r.Recover(t.Context(), true)
	require.NoError(t, err)
	require.Len(t, dry, 1)
	assert.Equal(t, recovery.ActionRecovered, dry[0].Action)
	assert.Empty(t, finished, "a dry run does nothing")

	res, err := r.Recover(t.Context(), false)
	require.NoError(t, err)
	require.Len(t, res, 1)
	assert.Equal(t, recovery.ActionRecovered, res[0].Action, res[0].Why)
	assert.Positive(t, res[0].RecoveredBytes)
	require.Len(t, finished, 1)
	assert.Equal(t, model.StatusFailed, finished[0].Status)
	assert.Equal(t, recovery.ReasonExecutorLost, finished[0].Reason)

	st, err := f.backend.InspectOrphan(t.Context(), f.rec.ContainerID)
	require.NoError(t, err)
	assert.False(t, st.Exists, "the container was removed")
	_, err = f.journal.Load(f.rec.RunID)
	require.ErrorIs(t, err, journal.ErrNotFound, "a recovered run leaves no record")
}

func TestRecoverKeepsARunWhoseStoreIsDownWithoutAMount(t *testing.T) {
	f := newFixture(t)
	f.die(t)
	storeDown := errors.New("store unreachable")
	calls := 0
	r := &recovery.Recoverer{
		Journal: f.journal, Containers: f.backend, StopGrace: time.Second,
		Finish: func(context.Context, journal.Record) error { calls++; return storeDown },
	}
	res, err := r.Recover(t.Context(), false)
	require.ErrorIs(t, err, storeDown)
	require.Len(t, res, 1)
	assert.Equal(t, recovery.ActionKept, res[0].Action)

	rec, err := f.journal.Load(f.rec.RunID)
	require.NoError(t, err)
	assert.Equal(t, journal.PhaseKept, rec.Phase)
	assert.Contains(t, rec.Reason, "store unreachable")
	mounted, err := diskcap.Mounted(f.rec.RunDir)
	require.NoError(t, err)
	assert.False(t, mounted, "a kept run holds no mount")
	st, err := f.backend.InspectOrphan(t.Context(), f.rec.ContainerID)
	require.NoError(t, err)
	assert.False(t, st.Exists, "a kept run holds no container: its output is on the host")
	requireWholeOutput(t, filepath.Join(f.rec.SpoolDir, recovery.StdoutSpoolName), 1)

	kept, err := recovery.Kept(f.journal)
	require.NoError(t, err)
	require.Len(t, kept, 1)

	// A later gc leaves the kept run as it is and says why it is kept.
	res, err = r.Recover(t.Context(), false)
	require.NoError(t, err)
	require.Len(t, res, 1)
	assert.Equal(t, recovery.ActionKept, res[0].Action)
	assert.Contains(t, res[0].Why, "store unreachable")
	assert.Equal(t, 1, calls)
}

func TestRecoverLeavesLiveRunsAlone(t *testing.T) {
	f := newFixture(t)
	r := &recovery.Recoverer{
		Journal: f.journal, Containers: f.backend,
		Finish: func(context.Context, journal.Record) error { t.Error("a live run was finished"); return nil },
	}
	res, err := r.Recover(t.Context(), false)
	require.NoError(t, err)
	require.Len(t, res, 1)
	assert.Equal(t, recovery.ActionNone, res[0].Action)
	st, err := f.backend.InspectOrphan(t.Context(), f.rec.ContainerID)
	require.NoError(t, err)
	assert.True(t, st.Running, "a live run's container keeps running")
	require.NoError(t, f.entry.Remove())
}

func TestMain(m *testing.M) {
	if err := exec.Command("docker", "image", "inspect", testImage).Run(); err != nil {
		fmt.Fprintf(os.Stderr, "recovery tests need %s: run `make images`\n", testImage)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// A run whose executor died after storing everything and releasing its
// directory, while it reported, keeps its verdict: Finish gets the record
// in the report phase (only the report is owed), not a FAILED run to store
// again from a directory that no longer exists.
func TestRecoverOnlyReportsARunThatStoredEverything(t *testing.T) {
	root := t.TempDir()
	jd, err := journal.Open(filepath.Join(root, "journal"))
	require.NoError(t, err)
	self, err := instance.Self()
	require.NoError(t, err)
	self.ID = instance.NewID() // an executor that is gone
	runID := "r" + strings.ToLower(instance.NewID())
	e, err := jd.Create(journal.Record{
		RunID: runID, UserID: "u", ConversationID: "c", TaskID: "t", SessionID: "s",
		Executor: self, RunDir: filepath.Join(root, "runs", runID), SpoolDir: filepath.Join(root, "runs", runID+".executor"),
		Store: "file:///nowhere", Phase: journal.PhasePrepare,
	})
	require.NoError(t, err)
	require.NoError(t, e.Update(func(r *journal.Record) {
		r.Phase, r.Status = journal.PhaseReport, model.StatusSucceeded
		r.Pending = []journal.Pending{journal.PendingReport}
	}))
	require.NoError(t, e.Close())

	var finished []journal.Record
	r := &recovery.Recoverer{Journal: jd, Finish: func(_ context.Context, rec journal.Record) error {
		finished = append(finished, rec)
		return nil
	}}
	res, err := r.Recover(t.Context(), false)
	require.NoError(t, err)
	require.Len(t, res, 1)
	assert.Equal(t, recovery.ActionRecovered, res[0].Action, res[0].Why)
	require.Len(t, finished, 1)
	assert.Equal(t, journal.PhaseReport, finished[0].Phase, "only the report is owed")
	assert.Equal(t, model.StatusSucceeded, finished[0].Status, "the run's verdict stands")
	_, err = jd.Load(runID)
	require.ErrorIs(t, err, journal.ErrNotFound, "a recovered run leaves no record")
}

// goneBeforeItsLog is an engine on which the container goes away between
// recovery seeing it and reading its log, as under load when another
// recovery removes it, or the engine marks it dead or for removal.
type goneBeforeItsLog struct {
	*docker.Backend
}

func (g goneBeforeItsLog) OrphanLogs(ctx context.Context, id string, stdout, stderr io.Writer) error {
	if err := g.RemoveOrphan(ctx, id); err != nil {
		return err
	}
	return g.Backend.OrphanLogs(ctx, id, stdout, stderr)
}

// A container that went away before its log was read does not fail the
// recovery (as `taskrun gc` once did under load, with the engine's "can not
// get logs from container which is dead or marked for removal"): the run is
// stored with what its spool holds, FAILED "executor lost", and its record
// is removed.
func TestRecoverFinishesARunWhoseContainerWentAwayBeforeItsLog(t *testing.T) {
	f := newFixture(t)
	f.die(t)
	var finished []journal.Record
	r := &recovery.Recoverer{
		Journal: f.journal, Containers: goneBeforeItsLog{f.backend}, StopGrace: time.Second,
		Finish: func(ctx context.Context, rec journal.Record) error {
			finished = append(finished, rec)
			requireWholeOutput(t, filepath.Join(rec.SpoolDir, recovery.StdoutSpoolName), 1)
			return diskcap.Release(rec.RunDir)
		},
	}
	res, err := r.Recover(t.Context(), false)
	require.NoError(t, err)
	require.Len(t, res, 1)
	assert.Equal(t, recovery.ActionRecovered, res[0].Action, res[0].Why)
	require.Len(t, finished, 1)
	assert.Equal(t, model.StatusFailed, finished[0].Status)
	assert.Equal(t, recovery.ReasonExecutorLost, finished[0].Reason)
	_, err = f.journal.Load(f.rec.RunID)
	require.ErrorIs(t, err, journal.ErrNotFound, "a recovered run leaves no record")
}
