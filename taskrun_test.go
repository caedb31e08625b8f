package taskrun_test

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

const testImage = "taskrun/testbox:local"

// last is the final PATCH rec received.
func last(t *testing.T, rec *controlplanetest.Recorder) workerclient.PatchTaskRunRequest {
	t.Helper()
	p, ok := rec.Last()
	require.True(t, ok, "the run was never reported")
	return p
}

// streamed is the stdout rec received as deltas.
func streamed(rec *controlplanetest.Recorder) string {
	data, _, _ := rec.Stream()
	return string(data)
}

// harness is the end-to-end Env of one test (real Docker, a file:// store,
// a run root, a tenant of its own).
type harness struct{ *runtest.Env }

func newHarness(t *testing.T) *harness {
	t.Helper()
	return &harness{runtest.New(t, runtest.Options{})}
}

// input is a run of cmd in the test image reporting to rec.
func (h *harness) input(rec *controlplanetest.Recorder, runID string, cmd ...string) taskrun.RunTaskInput {
	in := h.Input(runID, testImage, cmd...)
	in.Task.Prompt = "do the thing"
	in.Updater, in.StreamSender = rec, rec
	in.Timeout = time.Minute
	return in
}

// runFile reads a run's object back from the store.
func (h *harness) runFile(t *testing.T, runID, name string) string {
	t.Helper()
	data, err := h.RunFile(context.Background(), runID, name)
	require.NoError(t, err)
	return string(data)
}

func readAll(t *testing.T, rc io.ReadCloser, err error) string {
	t.Helper()
	require.NoError(t, err)
	defer rc.Close()
	data, err := io.ReadAll(rc)
	require.NoError(t, err)
	return string(data)
}

const agentScript = `
echo "reading $TASKRUN_PROMPT_FILE: $(cat $TASKRUN_PROMPT_FILE)"
head -1 /taskrun/AGENTS.md
echo delivered > /taskrun/artifacts/report.txt
mkdir -p /taskrun/global/traces/$TASKRUN_SESSION_ID
echo '{"event":"done"}' > /taskrun/global/traces/$TASKRUN_SESSION_ID/rt_$TASKRUN_RUN_ID.jsonl
echo "note from $TASKRUN_RUN_ID" >> $HOME/notes.txt
echo answer > /taskrun/output/result.md
printf 'last line without newline'
`

// RunTask: materializes, runs, streams, persists output, state, trace and
// artifact, and PATCHes SUCCEEDED with them.
func TestRunTaskSucceededPersistsEverythingAndReports(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "AGENTS.md"), []byte("workspace rules"), 0o644))
	in := h.input(rec, "run1", "sh", "-c", agentScript)
	in.Task.WorkspaceDir = ws

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)

	assert.Equal(t, model.StatusSucceeded, out.Status)
	wantOut := "reading /taskrun/prompt.txt: do the thing\n# Run directory\nlast line without newline"
	assert.Equal(t, wantOut, out.Result.OutputStr)
	assert.Equal(t, wantOut, streamed(rec), "stream deltas carry every stdout byte in order")
	_, ended, total := rec.Stream()
	assert.True(t, ended)
	assert.EqualValues(t, len(wantOut), total)
	assert.Equal(t, "traces/s1/rt_run1.jsonl", out.Result.TracePath)

	ctx := context.Background()
	assert.Equal(t, wantOut, h.runFile(t, "run1", taskrun.OutputLogName))
	rc, err := h.Store.OpenArtifact(ctx, h.Ref("run1"), "report.txt")
	assert.Equal(t, "delivered\n", readAll(t, rc, err))
	rc, err = h.Store.OpenGlobalFile(ctx, h.Tenant, out.Result.TracePath)
	assert.Equal(t, "{\"event\":\"done\"}\n", readAll(t, rc, err))
	assert.Equal(t, "answer\n", h.runFile(t, "run1", "output/result.md"))

	first, final := rec.Patches()[0], last(t, rec)
	assert.Equal(t, model.StatusRunning, first.Status)
	assert.Equal(t, model.StatusSucceeded, final.Status)
	require.NotNil(t, final.TracePath)
	assert.Equal(t, "traces/s1/rt_run1.jsonl", *final.TracePath)
	require.NotNil(t, final.Artifact)
	assert.EqualValues(t, len("delivered\n"), final.Artifact.Size)
	assert.NotEmpty(t, final.Artifact.SHA256)
	require.NotNil(t, final.ExitCode)
	assert.Equal(t, 0, *final.ExitCode)
	require.NotNil(t, final.Output)
	assert.Equal(t, wantOut, *final.Output)
}

// RunTask: restores the session when a previous run is named.
func TestRunTaskResumesPreviousSession(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	_, err := taskrun.Execute(context.Background(), h.input(rec, "first", "sh", "-c", agentScript))
	require.NoError(t, err)

	// Each run streams to a control plane of its own: the recorder holds
	// one run's stream.
	in := h.input(&controlplanetest.Recorder{}, "second", "sh", "-c", "cat $HOME/notes.txt")
	in.Run.PreviousRunID = "first"
	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, "note from first\n", out.Result.OutputStr)
}

// Every failure path PATCHes FAILED with a reason and persists partial output.
func TestRunTaskAgentFailurePersistsPartialOutput(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	out, err := taskrun.Execute(context.Background(), h.input(rec, "fail1", "sh", "-c", "echo partial; exit 3"))
	require.ErrorIs(t, err, taskrun.ErrRunFailed)
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.Equal(t, 3, out.Exit.ExitCode)
	final := last(t, rec)
	assert.Equal(t, model.StatusFailed, final.Status)
	require.NotNil(t, final.Error)
	assert.Equal(t, "agent exited with code 3", *final.Error)
	assert.Equal(t, "partial\n", h.runFile(t, "fail1", taskrun.OutputLogName))
}

func TestRunTaskTimeoutFails(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "slow1", "sh", "-c", "echo started; sleep 600")
	in.Timeout = 2 * time.Second
	out, err := taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, taskrun.ErrRunFailed)
	assert.True(t, out.Exit.TimedOut)
	assert.Equal(t, model.StatusFailed, last(t, rec).Status)
	assert.Contains(t, *last(t, rec).Error, "timed out")
	assert.Equal(t, "started\n", h.runFile(t, "slow1", taskrun.OutputLogName))
}

// A cancelled run is stopped with its grace period, reported CANCELLED, and
// what it printed while stopping still reaches the stream and the store.
func TestRunTaskCancelledReportsCancelled(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	var live lockedbuf.Buffer
	go func() {
		<-live.Seen("hi\n") // cancel once the container is running
		cancel()
	}()
	in := h.input(rec, "cancel1", "sh", "-c", "trap 'echo bye; exit 0' TERM; echo hi; sleep 600 & wait")
	in.Stdout = &live
	out, err := taskrun.Execute(ctx, in)
	require.ErrorIs(t, err, taskrun.ErrRunFailed)
	assert.Equal(t, model.StatusCancelled, out.Status)
	assert.Equal(t, model.StatusCancelled, last(t, rec).Status)
	assert.Equal(t, "hi\nbye\n", streamed(rec), "the output written during the stop grace is streamed")
	assert.Equal(t, "hi\nbye\n", h.runFile(t, "cancel1", taskrun.OutputLogName))
}

func TestRunTaskMissingImageFailsWithFix(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "noimg1")
	in.Image = "taskrun/does-not-exist:local"
	in.Pull = sandbox.PullNever // tests reach no registry but their own
	out, err := taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, sandbox.ErrImageNotFound)
	assert.Contains(t, err.Error(), "taskrun images build", "the error names the fix")
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.Empty(t, out.ContainerID)
	assert.Equal(t, model.StatusFailed, last(t, rec).Status)

	keys, err := h.Store.List(context.Background(), "tenants/")
	require.NoError(t, err)
	assert.Empty(t, keys, "nothing half-written in the store")
	entries, err := os.ReadDir(h.Root)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written on disk")
}

func TestRunTaskRefusesBadIDsBeforeTouchingDisk(t *testing.T) {
	h := newHarness(t)
	for _, bad := range []string{"../escape", "a/b", "", ".."} {
		rec := &controlplanetest.Recorder{}
		in := h.input(rec, "okrun")
		in.Task.ID = bad
		_, err := taskrun.Execute(context.Background(), in)
		require.ErrorIs(t, err, model.ErrInvalidID, "task ID %q", bad)
		entries, err := os.ReadDir(h.Root)
		require.NoError(t, err)
		assert.Empty(t, entries, "nothing may be written for task ID %q", bad)
		require.Len(t, rec.Patches(), 1, "a refused run is still reported")
		assert.Equal(t, model.StatusFailed, rec.Patches()[0].Status)
	}
}

// RunResult: Output holds the output up to the cap with an explicit marker;
// the complete output goes to blob storage.
func TestRunTaskCapsResultOutputButStoresItAll(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	size := taskrun.MaxResultOutputBytes + 4096
	out, err := taskrun.Execute(context.Background(), h.input(rec, "big1", "sh", "-c", "head -c "+strconv.Itoa(size)+" /dev/zero | tr '\\0' x"))
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(out.Result.OutputStr, taskrun.TruncationMarker))
	assert.Len(t, out.Result.Output, taskrun.MaxResultOutputBytes+len(taskrun.TruncationMarker))
	assert.True(t, last(t, rec).OutputTruncated)
	stored := h.runFile(t, "big1", taskrun.OutputLogName)
	assert.Len(t, stored, size)
	assert.Equal(t, size, len(streamed(rec)))
}

// A run cannot fill the host disk through /taskrun: writing past the run's
// disk cap fails inside the sandbox (loop-mounted cap, as root), or the
// watchdog stops the run and it FAILS (elsewhere).
func TestRunTaskDiskCapHolds(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "diskfill1", "sh", "-c", "dd if=/dev/zero of=/taskrun/home/fill bs=1M count=256 2>&1; sleep 3")
	in.DiskLimitBytes = 32 << 20

	out, err := taskrun.Execute(context.Background(), in)
	if errors.Is(err, taskrun.ErrDiskLimit) {
		assert.Equal(t, model.StatusFailed, out.Status, "the watchdog stopped the run")
		return
	}
	require.NoError(t, err)
	assert.Contains(t, out.Result.OutputStr, "No space left on device")
	var written int
	_, err = fmt.Sscanf(out.Result.OutputStr[strings.Index(out.Result.OutputStr, "records in\n")+len("records in\n"):], "%d+", &written)
	require.NoError(t, err)
	assert.Less(t, written, 32, "dd wrote %d MiB into a 32 MiB cap", written)
	templates, err := filepath.Glob(filepath.Join(executor.DiskCapTemplatesDir(h.Root), fmt.Sprintf("ext4-*-%d.img", 32<<20)))
	require.NoError(t, err)
	assert.Len(t, templates, 1, "the run's filesystem was copied from the runs root's template of its size")
}

// A 10k-file home survives run -> session state -> resumed run with
// identical content and modes.
func TestRunTaskSessionRoundTrip10kFiles(t *testing.T) {
	h := newHarness(t)
	ws := t.TempDir()
	var want []string
	for d := range 100 {
		dir := filepath.Join(ws, fmt.Sprintf("d%03d", d))
		require.NoError(t, os.Mkdir(dir, 0o750))
		want = append(want, fmt.Sprintf("750 ./d%03d", d))
		for f := range 100 {
			name := fmt.Sprintf("f%03d.txt", f)
			mode := os.FileMode(0o644)
			if f%7 == 0 {
				mode = 0o755
			} else if f%5 == 0 {
				mode = 0o600
			}
			data := fmt.Sprintf("file %d/%d\n", d, f)
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(data), mode))
			require.NoError(t, os.Chmod(filepath.Join(dir, name), mode))
			want = append(want, fmt.Sprintf("%o %s %x", mode.Perm(), "./"+filepath.Base(dir)+"/"+name, md5.Sum([]byte(data))))
		}
	}
	rec := &controlplanetest.Recorder{}
	first := h.input(rec, "tenk1", "true")
	first.Task.WorkspaceDir = ws
	first.Timeout = 5 * time.Minute
	_, err := taskrun.Execute(context.Background(), first)
	require.NoError(t, err)

	// Inside the resumed run: mode and path of every dir, and mode, path and
	// MD5 of every file.
	list := `cd $HOME && { find . -mindepth 1 -type d -exec stat -c '%a %n' {} +;
		find . -type f -exec stat -c '%a %n' {} + | sort -k2 > /tmp/modes; find . -type f -exec md5sum {} + | sort -k2 > /tmp/sums;
		paste -d' ' /tmp/modes /tmp/sums | awk '{print $1, $2, $3}'; }`
	second := h.input(rec, "tenk2", "sh", "-c", list)
	second.Run.PreviousRunID = "tenk1"
	second.Timeout = 5 * time.Minute
	out, err := taskrun.Execute(context.Background(), second)
	require.NoError(t, err)
	got := strings.Split(strings.TrimSpace(string(out.Result.Output)), "\n")
	sort.Strings(got)
	sort.Strings(want)
	require.Len(t, got, len(want))
	assert.Equal(t, want, got)
}

// downStore is a PersistStorage whose run-file uploads fail, as a store that
// went down mid-run.
type downStore struct{ *persist.Store }

func (downStore) PutRunFile(context.Context, persist.RunRef, string, io.Reader, string) (persist.ObjectInfo, error) {
	return persist.ObjectInfo{}, fmt.Errorf("%w: connection refused", persist.ErrStoreUnavailable)
}

// A successful run leaves nothing on the host; a run whose persistence failed
// keeps its run directory and output spool as the local copy for a retry,
// and FAILS with the store as reason.
func TestRunTaskLocalFilesAfterPersist(t *testing.T) {
	h := newHarness(t)
	runDir := func(run string) string {
		return taskrun.NewRuntimePathsFromRoot(h.Root).RuntimeTaskRunDir(h.Tenant, "conv1", "task1", run)
	}

	_, err := taskrun.Execute(context.Background(), h.input(&controlplanetest.Recorder{}, "clean1", "sh", "-c", "echo hi > $HOME/f"))
	require.NoError(t, err)
	assert.NoDirExists(t, runDir("clean1"))

	kept := h.input(&controlplanetest.Recorder{}, "kept1", "sh", "-c", "echo hi > $HOME/f")
	kept.KeepRunDir = true
	_, err = taskrun.Execute(context.Background(), kept)
	require.NoError(t, err)
	assert.FileExists(t, filepath.Join(runDir("kept1"), "home", "f"))

	rec := &controlplanetest.Recorder{}
	down := h.input(rec, "down1", "sh", "-c", "echo precious; echo hi > $HOME/f")
	down.Persist = downStore{h.Store}
	out, err := taskrun.Execute(context.Background(), down)
	require.ErrorIs(t, err, persist.ErrStoreUnavailable)
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.Contains(t, *last(t, rec).Error, "is kept")
	// The kept copy holds no mount; its image, reattached, has the files.
	t.Cleanup(func() { assert.NoError(t, diskcap.Release(runDir("down1"))) })
	mounted, err := diskcap.Mounted(runDir("down1"))
	require.NoError(t, err)
	assert.False(t, mounted, "a kept run holds no mount")
	release, err := diskcap.Reattach(context.Background(), runDir("down1"))
	require.NoError(t, err)
	assert.FileExists(t, filepath.Join(runDir("down1"), "home", "f"))
	require.NoError(t, release())
	spool, err := os.ReadFile(runDir("down1") + ".executor/stdout.log")
	require.NoError(t, err)
	assert.Equal(t, "precious\n", string(spool), "the complete output is kept locally")
}

// A stdout flood past MaxOutputBytes is drained from the container but not
// kept: the host keeps the first MaxOutputBytes, the run still completes, and
// the drop is reported.
func TestRunTaskCapsKeptOutput(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "flood1", "sh", "-c", "head -c 8388608 /dev/zero; echo done >&2")
	in.MaxOutputBytes = 2 << 20

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.EqualValues(t, 6<<20, out.DroppedOutputBytes)
	assert.Len(t, h.runFile(t, "flood1", taskrun.OutputLogName), 2<<20, "the host kept exactly the cap")
	assert.Equal(t, 2<<20, len(streamed(rec)), "the stream stops at the cap too")
	assert.True(t, last(t, rec).OutputTruncated)
	assert.Equal(t, "done\n", h.runFile(t, "flood1", taskrun.StderrLogName))
}

// RetryPersist finishes a run whose store was down: everything the run kept
// on the host reaches the store, the run is reported as it would have been,
// and the local copy is gone.
func TestRetryPersistAfterStoreOutage(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	down := h.input(rec, "retry1", "sh", "-c", agentScript)
	down.Persist = downStore{h.Store}
	_, err := taskrun.Execute(context.Background(), down)
	require.ErrorIs(t, err, persist.ErrStoreUnavailable)
	require.Equal(t, model.StatusFailed, last(t, rec).Status)

	retry := h.input(rec, "retry1")
	retry.Sandbox = nil // RetryPersist runs nothing
	out, err := taskrun.RetryPersist(context.Background(), retry)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, out.Status)
	final := last(t, rec)
	assert.Equal(t, model.StatusSucceeded, final.Status)
	require.NotNil(t, final.TracePath)
	require.NotNil(t, final.Artifact)
	assert.Contains(t, h.runFile(t, "retry1", taskrun.OutputLogName), "last line without newline")
	assert.Contains(t, h.runFile(t, "retry1", taskrun.AuditRecordName), out.ContainerID, "the isolation record was kept too")
	assert.Equal(t, "answer\n", h.runFile(t, "retry1", "output/result.md"))
	assert.NoDirExists(t, taskrun.NewRuntimePathsFromRoot(h.Root).RuntimeTaskRunDir(h.Tenant, "conv1", "task1", "retry1"))

	_, err = taskrun.RetryPersist(context.Background(), retry)
	require.ErrorIs(t, err, taskrun.ErrNothingKept, "nothing is left to retry")
}

// A run whose agent left files no key can take, and whose store was down,
// is retried successfully: the unstorable files are skipped with their
// reasons, every other file is stored, and nothing is left to retry.
func TestRetryPersistSkipsUnstorableNames(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	down := h.input(rec, "retrynames1", "sh", "-c", `cd /taskrun/artifacts
echo x > "$(printf 'bad\377name')"; echo x > "$(printf 'rtl\342\200\256txt')"; echo x > meta.attrs
echo good > zz-good.txt`)
	down.Persist = downStore{h.Store}
	_, err := taskrun.Execute(context.Background(), down)
	require.ErrorIs(t, err, persist.ErrStoreUnavailable)

	retry := h.input(rec, "retrynames1")
	retry.Sandbox = nil
	out, err := taskrun.RetryPersist(context.Background(), retry)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, out.Status)
	require.Len(t, out.Artifacts, 1)
	assert.True(t, strings.HasSuffix(out.Artifacts[0].Key, "/artifacts/zz-good.txt"), out.Artifacts[0].Key)
	skipped := map[string]string{}
	for _, s := range out.Skipped {
		skipped[s.Root+"/"+s.Path] = s.Reason
	}
	for _, name := range []string{"bad\377name", "rtl\u202etxt", "meta.attrs"} {
		assert.Contains(t, skipped["artifacts/"+name], "persist: invalid name", name)
	}
	_, err = taskrun.RetryPersist(context.Background(), retry)
	require.ErrorIs(t, err, taskrun.ErrNothingKept, "nothing is left to retry")
}

// SessionExcludes leaves matching paths out of the session state a resumed
// run gets back.
func TestRunTaskSessionExcludes(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	first := h.input(rec, "excl1", "sh", "-c", "echo keep > $HOME/kept.txt; mkdir -p $HOME/build; echo tmp > $HOME/build/obj.o")
	first.SessionExcludes = []string{"build"}
	_, err := taskrun.Execute(context.Background(), first)
	require.NoError(t, err)

	second := h.input(rec, "excl2", "sh", "-c", "ls -A $HOME")
	second.Run.PreviousRunID = "excl1"
	out, err := taskrun.Execute(context.Background(), second)
	require.NoError(t, err)
	assert.Equal(t, "kept.txt\n", out.Result.OutputStr)
}

// A run that reuses the ID of a run whose copy is kept is refused, and the
// kept copy survives for RetryPersist.
func TestRunTaskReusedRunIDLeavesTheKeptCopy(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	dir := taskrun.NewRuntimePathsFromRoot(h.Root).RuntimeTaskRunDir(h.Tenant, "conv1", "task1", "dup1")
	down := h.input(rec, "dup1", "sh", "-c", "echo precious")
	down.Persist = downStore{h.Store}
	_, err := taskrun.Execute(context.Background(), down)
	require.ErrorIs(t, err, persist.ErrStoreUnavailable)

	patches := len(rec.Patches())
	_, err = taskrun.Execute(context.Background(), h.input(rec, "dup1", "sh", "-c", "echo second"))
	require.ErrorIs(t, err, journal.ErrExists)
	assert.Contains(t, err.Error(), "taskrun persist --run-id dup1")
	assert.Len(t, rec.Patches(), patches, "nothing is reported for a run ID another run holds")
	// The kept copy waits in its disk-cap image, holding no mount.
	assert.True(t, diskcap.HasImage(dir), "the first run's kept copy is untouched")
	mounted, err := diskcap.Mounted(dir)
	require.NoError(t, err)
	assert.False(t, mounted, "a kept run holds no mount")

	retry := h.input(rec, "dup1")
	retry.Sandbox = nil
	_, err = taskrun.RetryPersist(context.Background(), retry)
	require.NoError(t, err)
	assert.Equal(t, "precious\n", h.runFile(t, "dup1", taskrun.OutputLogName))
}

// A run that timed out while its store was down says both, and the retry
// reports the run's own verdict (the timeout), as RunTask would have.
func TestRetryPersistKeepsTheRunsVerdict(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	down := h.input(rec, "slowdown1", "sh", "-c", "echo started; sleep 600")
	down.Timeout = 2 * time.Second
	down.Persist = downStore{h.Store}
	out, err := taskrun.Execute(context.Background(), down)
	require.ErrorIs(t, err, persist.ErrStoreUnavailable)
	assert.Contains(t, out.Reason, "timed out after 2s")
	assert.Contains(t, out.Reason, "taskrun persist", "the reason says the outputs wait on the host")

	retry := h.input(rec, "slowdown1")
	retry.Sandbox = nil
	out, err = taskrun.RetryPersist(context.Background(), retry)
	require.ErrorIs(t, err, taskrun.ErrRunFailed)
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.Equal(t, "timed out after 2s", out.Reason)
	assert.Equal(t, "timed out after 2s", *last(t, rec).Error)
	assert.Equal(t, "started\n", h.runFile(t, "slowdown1", taskrun.OutputLogName))
}

// A run cancelled before it started is reported CANCELLED, and the report
// is delivered although the caller's context is done.
func TestRunTaskCancelledBeforeStart(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, err := taskrun.Execute(ctx, h.input(rec, "early1", "true"))
	require.ErrorIs(t, err, taskrun.ErrRunFailed)
	assert.Equal(t, model.StatusCancelled, out.Status)
	assert.Equal(t, model.StatusCancelled, last(t, rec).Status)
}
