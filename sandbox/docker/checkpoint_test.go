package docker

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker/runscrestore"
)

// EnvRequireRunsc, set to 1, makes the memory checkpoint tests fail
// instead of skipping when the engine lacks runsc or the restore runtime.
const EnvRequireRunsc = "TASKRUN_REQUIRE_RUNSC"

// needMemoryCheckpoints skips (or, with TASKRUN_REQUIRE_RUNSC=1, fails)
// unless b checkpoints gVisor runs with their memory.
func needMemoryCheckpoints(t *testing.T, b *Backend) {
	t.Helper()
	if b.Capabilities().CheckpointsFor(sandbox.RuntimeGVisor) == sandbox.CheckpointMemory {
		return
	}
	msg := fmt.Sprintf("the engine has no memory checkpoints: runsc and %s must be registered (scripts/test-setup.sh)", RestoreRuntime)
	if os.Getenv(EnvRequireRunsc) == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// counterScript prints a counter that lives only in the shell's memory,
// with how many lines a file on the sandbox's /tmp tmpfs holds, which
// grows with it.
const counterScript = `i=0; while :; do i=$((i+1)); echo $i >>/tmp/trail; echo "$i $(wc -l </tmp/trail)"; sleep 0.05; done`

// readerScript is counterScript that also reads the next line of
// /taskrun/input through a descriptor it keeps open: its offset lives in
// the sandbox too.
const readerScript = `exec 3</taskrun/input; i=0; while :; do i=$((i+1)); read -r line <&3; echo $i >>/tmp/trail; echo "$i $(wc -l </tmp/trail) $line"; sleep 0.05; done`

// writeInput writes the lines readerScript reads into dir/input.
func writeInput(t *testing.T, dir string) {
	t.Helper()
	var sb strings.Builder
	for k := 1; k <= 20000; k++ {
		fmt.Fprintf(&sb, "line%d\n", k)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "input"), []byte(sb.String()), 0o644))
}

// TestPauseResumeKeepsMemoryAcrossRunsRoots is the memory checkpoint's
// end-to-end test: a gVisor run whose state is only in memory (a counter,
// the offset of a file it reads) and on its tmpfs is checkpointed, packed as it would be stored, its host files are
// removed, and it is restored from the unpacked archive under another runs
// root, with its output appended to the log: the log has no gap and no
// repeated line.
func TestPauseResumeKeepsMemoryAcrossRunsRoots(t *testing.T) {
	b, labels := newTestBackend(t)
	needMemoryCheckpoints(t, b)
	pol := sandbox.DefaultPolicy()
	pol.Runtime = sandbox.RuntimeGVisor
	// Where the paused run's objects go.
	store, err := persist.Open(t.Context(), "file://"+t.TempDir())
	require.NoError(t, err)
	defer store.Close()

	// The first host: runs root 1.
	root1 := t.TempDir()
	runDir1 := filepath.Join(root1, "run")
	require.NoError(t, os.MkdirAll(runDir1, 0o755))
	writeInput(t, runDir1)
	var log1 *os.File
	log1, err = os.Create(filepath.Join(runDir1, "stdout.log"))
	require.NoError(t, err)
	spec := sandbox.Spec{
		Image: testImage, Cmd: []string{"sh", "-c", readerScript}, Labels: labels, Timeout: 5 * time.Minute,
		Mounts: []sandbox.Mount{{Source: runDir1, Target: "/taskrun", ReadOnly: true}},
	}
	h, err := b.Start(t.Context(), spec, pol, sandbox.Streams{Stdout: log1, Stderr: io.Discard})
	require.NoError(t, err)
	waitLines(t, log1.Name(), 10)

	ref := model.RunRef{UserID: "alice", ConversationID: "c1", TaskID: "t1", RunID: "r1"}
	began := time.Now()
	m, err := checkpoint.Pause(t.Context(), b, h, store, ref, checkpoint.Manifest{Runtime: pol.Runtime, Policy: &pol}, root1)
	require.NoError(t, err)
	pause := time.Since(began)
	res := h.Wait(t.Context())
	require.NoError(t, h.Close(t.Context()))
	t.Logf("pause (checkpoint, pack, store): %v, exit %d, archive %d bytes", pause, res.ExitCode, m.Size)
	require.NoError(t, log1.Close())
	before := readLog(t, log1.Name())
	// The record keeps where the output stopped, once it was drained.
	m.StdoutOffset = int64(len(before))

	_, err = store.PutRunFile(t.Context(), ref, "output.log", strings.NewReader(before), "text/plain")
	require.NoError(t, err)
	require.NoError(t, os.RemoveAll(root1))

	// The second host: runs root 2, from what the store keeps and the
	// manifest the run's record kept.
	root2 := t.TempDir()
	runDir2 := filepath.Join(root2, "run")
	require.NoError(t, os.MkdirAll(runDir2, 0o755))
	writeInput(t, runDir2) // the run's files, which the host keeps as for any run
	r, err := store.OpenRunFile(t.Context(), ref, "output.log")
	require.NoError(t, err)
	saved, err := io.ReadAll(r)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	require.Len(t, saved, int(m.StdoutOffset))
	log2 := filepath.Join(runDir2, "stdout.log")
	require.NoError(t, os.WriteFile(log2, saved, 0o600))
	out, err := os.OpenFile(log2, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	defer out.Close()
	spec.Mounts = []sandbox.Mount{{Source: runDir2, Target: "/taskrun", ReadOnly: true}}
	began = time.Now()
	h2, _, err := checkpoint.Resume(t.Context(), b, store, ref, m, spec, pol, sandbox.Streams{Stdout: out, Stderr: io.Discard}, root2, 0)
	require.NoError(t, err)
	resume := time.Since(began)
	t.Logf("resume (fetch, check, unpack, create and start): %v", resume)
	n := strings.Count(before, "\n")
	waitLines(t, log2, n+10)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	h2.Wait(ctx)
	require.NoError(t, h2.Close(t.Context()))

	lines := strings.Split(strings.TrimSuffix(readLog(t, log2), "\n"), "\n")
	require.Greater(t, len(lines), n+5)
	for k, line := range lines {
		want := strconv.Itoa(k + 1)
		require.Equal(t, want+" "+want+" line"+want, line, "line %d of the log (the checkpoint was after line %d)", k+1, n)
	}
}

// waitLines waits until the file holds at least n lines.
func waitLines(t *testing.T, path string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Count(readLog(t, path), "\n") >= n }, time.Minute, 50*time.Millisecond)
}

// readLog returns the whole lines of a log file.
func readLog(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var sb strings.Builder
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return sb.String()
		}
		sb.WriteString(line)
	}
}

func TestRestoreRefusesTheReservedVariable(t *testing.T) {
	b, labels := newTestBackend(t)
	spec := sandbox.Spec{Image: testImage, Cmd: []string{"true"}, Labels: labels, Env: []string{runscrestore.EnvRestoreImage + "=" + t.TempDir()}}
	pol := sandbox.DefaultPolicy()
	pol.Runtime = sandbox.RuntimeGVisor
	_, err := b.Create(t.Context(), spec, pol)
	require.ErrorContains(t, err, "is reserved")
	ids, err := b.listLabelled(t.Context(), labels)
	require.NoError(t, err)
	require.Empty(t, ids)
}

func TestRestoreNeedsGVisor(t *testing.T) {
	b, labels := newTestBackend(t)
	spec := sandbox.Spec{Image: testImage, Cmd: []string{"true"}, Labels: labels, RestoreFrom: t.TempDir()}
	_, err := b.Create(t.Context(), spec, sandbox.DefaultPolicy())
	require.ErrorIs(t, err, sandbox.ErrCheckpointUnsupported)
	ids, err := b.listLabelled(t.Context(), labels)
	require.NoError(t, err)
	require.Empty(t, ids)
}

func TestCapabilitiesStateMemoryCheckpointsForGVisorOnly(t *testing.T) {
	b, _ := newTestBackend(t)
	needMemoryCheckpoints(t, b)
	caps := b.Capabilities()
	require.Equal(t, sandbox.CheckpointMemory, caps.CheckpointsFor(sandbox.RuntimeGVisor))
	require.Equal(t, sandbox.CheckpointNone, caps.CheckpointsFor(""), "runc has no CRIU checkpoints here")
	require.Equal(t, sandbox.CheckpointNone, caps.CheckpointsFor(RestoreRuntime), "the restore runtime is not a run's runtime")
}

// forkScript is counterScript that also appends each value to
// /work/changes, a file of the run's writable workspace, opened by its path
// each time.
const forkScript = `i=0; while :; do i=$((i+1)); echo $i >>/tmp/trail; echo $i >>/work/changes; echo "$i $(wc -l </tmp/trail)"; sleep 0.05; done`

// TestForksGoOnFromOneCheckpoint pauses a run and resumes, from its one
// stored checkpoint, the run itself and four forks, each with a workspace
// of its own: each goes on from the counter the checkpoint held, with
// memory and a tmpfs of its own, and writes its changes to its own
// workspace only; the parent's workspace holds the parent's alone.
func TestForksGoOnFromOneCheckpoint(t *testing.T) {
	b, labels := newTestBackend(t)
	needMemoryCheckpoints(t, b)
	pol := sandbox.DefaultPolicy()
	pol.Runtime = sandbox.RuntimeGVisor
	store, err := persist.Open(t.Context(), "file://"+t.TempDir())
	require.NoError(t, err)
	defer store.Close()
	ref := model.RunRef{UserID: "alice", ConversationID: "c1", TaskID: "t1", RunID: "parent"}
	workspace := func() string {
		dir := t.TempDir()
		require.NoError(t, os.Chmod(dir, 0o777))
		return dir
	}

	parentWork := workspace()
	logPath := filepath.Join(t.TempDir(), "stdout.log")
	log, err := os.Create(logPath)
	require.NoError(t, err)
	spec := sandbox.Spec{
		Image: testImage, Cmd: []string{"sh", "-c", forkScript}, Labels: labels, Timeout: 5 * time.Minute,
		Mounts: []sandbox.Mount{{Source: parentWork, Target: "/work"}},
	}
	h, err := b.Start(t.Context(), spec, pol, sandbox.Streams{Stdout: log, Stderr: io.Discard})
	require.NoError(t, err)
	waitLines(t, logPath, 5)
	m, err := checkpoint.Pause(t.Context(), b, h, store, ref, checkpoint.Manifest{Runtime: pol.Runtime, Policy: &pol}, t.TempDir())
	require.NoError(t, err)
	h.Wait(t.Context())
	require.NoError(t, h.Close(t.Context()))
	require.NoError(t, log.Close())
	n := strings.Count(readLog(t, logPath), "\n")
	c := strings.Count(readLog(t, filepath.Join(parentWork, "changes")), "\n")
	require.GreaterOrEqual(t, c, n)

	// The parent goes on in its own workspace, each fork in a new one.
	const forks = 4
	works := []string{parentWork}
	for range forks {
		works = append(works, workspace())
	}
	var handles []sandbox.Handle
	var logs []string
	for _, work := range works {
		p := filepath.Join(t.TempDir(), "stdout.log")
		out, err := os.Create(p)
		require.NoError(t, err)
		defer out.Close()
		fs := spec
		fs.Mounts = []sandbox.Mount{{Source: work, Target: "/work"}}
		fh, _, err := checkpoint.Resume(t.Context(), b, store, ref, m, fs, pol, sandbox.Streams{Stdout: out, Stderr: io.Discard}, t.TempDir(), 0)
		require.NoError(t, err)
		handles, logs = append(handles, fh), append(logs, p)
	}
	for k, fh := range handles {
		waitLines(t, logs[k], 5)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		fh.Wait(ctx)
		require.NoError(t, fh.Close(t.Context()))
		lines := strings.Split(strings.TrimSuffix(readLog(t, logs[k]), "\n"), "\n")
		for j, line := range lines {
			want := strconv.Itoa(n + j + 1)
			require.Equal(t, want+" "+want, line, "sandbox %d (0 is the parent), stdout line %d", k, j+1)
		}
		first := 1 // the parent's workspace holds its values from the start
		if k > 0 {
			first = c + 1 // a fork's holds only its own, from the checkpoint on
		}
		changes := strings.Split(strings.TrimSuffix(readLog(t, filepath.Join(works[k], "changes")), "\n"), "\n")
		require.Greater(t, len(changes), 1)
		for j, v := range changes {
			require.Equal(t, strconv.Itoa(first+j), v, "sandbox %d (0 is the parent), changes line %d", k, j+1)
		}
	}
}

// TestPauseTwice pauses a run, resumes it, and pauses and resumes it
// again: a restored sandbox checkpoints like any other.
func TestPauseTwice(t *testing.T) {
	b, labels := newTestBackend(t)
	needMemoryCheckpoints(t, b)
	pol := sandbox.DefaultPolicy()
	pol.Runtime = sandbox.RuntimeGVisor
	store, err := persist.Open(t.Context(), "file://"+t.TempDir())
	require.NoError(t, err)
	defer store.Close()
	ref := model.RunRef{UserID: "alice", ConversationID: "c1", TaskID: "t1", RunID: "twice"}
	logPath := filepath.Join(t.TempDir(), "stdout.log")
	out, err := os.Create(logPath)
	require.NoError(t, err)
	defer out.Close()
	streams := sandbox.Streams{Stdout: out, Stderr: io.Discard}
	spec := sandbox.Spec{Image: testImage, Cmd: []string{"sh", "-c", counterScript}, Labels: labels, Timeout: 5 * time.Minute}
	h, err := b.Start(t.Context(), spec, pol, streams)
	require.NoError(t, err)
	lines := 5
	for range 2 {
		waitLines(t, logPath, lines)
		m, err := checkpoint.Pause(t.Context(), b, h, store, ref, checkpoint.Manifest{Runtime: pol.Runtime, Policy: &pol}, t.TempDir())
		require.NoError(t, err)
		h.Wait(t.Context())
		require.NoError(t, h.Close(t.Context()))
		lines = strings.Count(readLog(t, logPath), "\n") + 5
		h, _, err = checkpoint.Resume(t.Context(), b, store, ref, m, spec, pol, streams, t.TempDir(), 0)
		require.NoError(t, err)
	}
	waitLines(t, logPath, lines)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	h.Wait(ctx)
	require.NoError(t, h.Close(t.Context()))
	for k, line := range strings.Split(strings.TrimSuffix(readLog(t, logPath), "\n"), "\n") {
		want := strconv.Itoa(k + 1)
		require.Equal(t, want+" "+want, line, "line %d", k+1)
	}
}

// TestRestoreRuntimePassesOtherContainersThrough runs a container that
// asks for no restore under the restore runtime: it is a plain gVisor run.
func TestRestoreRuntimePassesOtherContainersThrough(t *testing.T) {
	b, labels := newTestBackend(t)
	needMemoryCheckpoints(t, b)
	pol := sandbox.DefaultPolicy()
	pol.Runtime = RestoreRuntime
	var out strings.Builder
	h, err := b.Start(t.Context(), sandbox.Spec{Image: testImage, Cmd: []string{"sh", "-c", "echo hello; dmesg | head -n 1"}, Labels: labels, Timeout: time.Minute},
		pol, sandbox.Streams{Stdout: &out, Stderr: io.Discard})
	require.NoError(t, err)
	res := h.Wait(t.Context())
	require.NoError(t, h.Close(t.Context()))
	require.NoError(t, res.Err)
	require.Equal(t, 0, res.ExitCode)
	require.Contains(t, out.String(), "hello\n")
	require.Contains(t, out.String(), "gVisor", "the sandbox runs under gVisor")
}
