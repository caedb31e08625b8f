package executor_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// forkSpec is the spec of fork id of run r1, asked with prompt.
func forkSpec(parent executor.Spec, id, prompt string) (executor.Spec, *controlplanetest.Recorder) {
	rec := &controlplanetest.Recorder{}
	task := *parent.Task
	task.Prompt = prompt
	spec := parent
	spec.Task, spec.Updater, spec.StreamSender, spec.Stdout = &task, rec, rec, nil
	spec.Run = &model.TaskRun{ID: id, TaskID: parent.Run.TaskID, ParentRunID: parent.Run.ID}
	return spec, rec
}

// runPatch is the stored change set of run id.
func runPatch(t *testing.T, h *executor.Host, id string) string {
	t.Helper()
	rc, err := h.Store().OpenRunFile(t.Context(), model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: id}, executor.ChangesPatchName)
	require.NoError(t, err, "run %s has a change set", id)
	defer rc.Close()
	raw, err := io.ReadAll(rc)
	require.NoError(t, err)
	return string(raw)
}

// forkFilesHost is a host on the plain fake (files only, as runc) whose
// agent, run afresh, writes progress into its home and waits; started
// again in a home holding progress, it writes a file named by its prompt.
func forkFilesHost(t *testing.T) (*executor.Host, executor.Spec) {
	t.Helper()
	fake := sandboxfake.New(sandboxfake.WithMaxStopGrace(time.Millisecond))
	fake.Install("/agent/files", func(ctx context.Context, p *sandboxfake.Process) int {
		prompt, _ := p.ReadFile("/taskrun/" + model.PromptFileName)
		if prev, _ := p.ReadFile("/taskrun/home/progress"); len(prev) > 0 {
			if err := p.WriteFile("/taskrun/home/"+string(prompt)+".txt", []byte(string(prompt)+" went on from "+string(prev)+"\n")); err != nil {
				return 1
			}
			fmt.Fprintf(p.Stdout, "%s after %s\n", prompt, prev)
			return 0
		}
		if err := p.WriteFile("/taskrun/home/progress", []byte("step1")); err != nil {
			return 1
		}
		fmt.Fprintln(p.Stdout, "step1")
		select {
		case <-ctx.Done():
			return 137
		case <-p.Terminated():
			return 137
		}
	})
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "base.txt"), []byte("the original workspace\n"), 0o644))
	h, err := executor.New(t.Context(), executor.Config{
		Root: t.TempDir(), Backend: fake, Store: memStore(t), Logger: discard,
		Defaults: executor.Defaults{Image: "fake/agent", DiskLimitBytes: -1, Command: []string{"/agent/files"}},
	})
	require.NoError(t, err)
	spec := executor.Spec{
		Task: &model.Task{ID: "t", UserID: "u", ConversationID: "c", Prompt: "parent", WorkspaceDir: ws},
		Run:  &model.TaskRun{ID: "r1", TaskID: "t"}, SessionID: "s", Updater: &controlplanetest.Recorder{},
	}
	return h, spec
}

// forkAll runs n forks of spec's run from from at once and returns their
// outcomes, by run ID.
func forkAll(t *testing.T, h *executor.Host, spec executor.Spec, from executor.ForkFrom, n int) map[string]*executor.Outcome {
	t.Helper()
	var mu sync.Mutex
	outs := map[string]*executor.Outcome{}
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("f%d", i)
		fs, _ := forkSpec(spec, id, id)
		wg.Go(func() {
			out, err := h.Fork(t.Context(), fs, from)
			assert.NoError(t, err, "fork %s", id)
			mu.Lock()
			outs[id] = out
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Len(t, outs, n)
	return outs
}

// Four forks of a run paused files-only each start in a copy of its home
// and produce a change set of their own against the original workspace:
// the parent's change before the pause, and their own file, none of the
// others'. Each is a run of its own whose records name its parent; the
// parent resumes as if nothing had been forked.
func TestForksOfAPausedRunHaveTheirOwnChangeSets(t *testing.T) {
	h, spec := forkFilesHost(t)
	ran := make(chan error, 1)
	go func() { _, err := h.Run(t.Context(), spec); ran <- err }()
	out := pauseLive(t, h)
	require.ErrorIs(t, <-ran, executor.ErrPaused)
	require.Equal(t, sandbox.CheckpointFiles, out.Checkpoint.Kind)

	outs := forkAll(t, h, spec, executor.ForkFrom{Checkpoint: out.Checkpoint}, 4)
	for id, o := range outs {
		require.NotNil(t, o, id)
		assert.Equal(t, model.StatusSucceeded, o.Status, "fork %s: %s", id, o.Reason)
		assert.Equal(t, id+" after step1\n", o.Result.OutputStr, "a files fork starts its command afresh")
		patch := runPatch(t, h, id)
		assert.Contains(t, patch, "+++ b/"+id+".txt")
		assert.Contains(t, patch, "+++ b/progress", "the change set is against the original workspace, not the parent's home")
		assert.NotContains(t, patch, "base.txt", "the original workspace is the base")
		for other := range outs {
			if other != id {
				assert.NotContains(t, patch, other+".txt", "fork %s holds no change of fork %s", id, other)
			}
		}
		idx, err := runindex.Find(t.Context(), h.Store().(*persist.Store), id, "u")
		require.NoError(t, err)
		assert.Equal(t, "r1", idx.ParentRunID, "the index record names the parent")
	}

	resumed, err := h.Resume(t.Context(), spec, *out.Checkpoint)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, resumed.Status, resumed.Reason)
	assert.Equal(t, "step1\nparent after step1\n", resumed.Result.OutputStr)
	patch := runPatch(t, h, "r1")
	assert.Contains(t, patch, "+++ b/parent.txt")
	assert.NotContains(t, patch, "f1.txt", "the parent holds none of its forks' changes")
	idx, err := runindex.Find(t.Context(), h.Store().(*persist.Store), "r1", "u")
	require.NoError(t, err)
	assert.Empty(t, idx.ParentRunID)
}

// A memory fork goes on where its parent was checkpointed: its log starts
// with the parent's output up to the checkpoint, and its stream too (it
// is a run of its own). The parent resumes from the same point.
func TestMemoryForksGoOnFromTheCheckpoint(t *testing.T) {
	h, _, spec, _ := pauseHost(t, &runtest.StepLog{})
	ran := make(chan error, 1)
	go func() { _, err := h.Run(t.Context(), spec); ran <- err }()
	out := pauseLive(t, h)
	require.ErrorIs(t, <-ran, executor.ErrPaused)
	require.Equal(t, sandbox.CheckpointMemory, out.Checkpoint.Kind)
	for _, id := range []string{"f1", "f2"} {
		fs, rec := forkSpec(spec, id, "go on")
		o, err := h.Fork(t.Context(), fs, executor.ForkFrom{Checkpoint: out.Checkpoint})
		require.NoError(t, err)
		assert.Equal(t, "0\n1\n2\n3\n4\n5\n", o.Result.OutputStr)
		stream, _, _ := rec.Stream()
		assert.Equal(t, "0\n1\n2\n3\n4\n5\n", string(stream), "a fork's stream is its own, from its first byte")
	}
	resumed, err := h.Resume(t.Context(), spec, *out.Checkpoint)
	require.NoError(t, err)
	assert.Equal(t, "0\n1\n2\n3\n4\n5\n", resumed.Result.OutputStr)
}

// A fork binds the checkpoint to the parent it names: a checkpoint of
// another run or tenant, a changed archive or state, and a resume of the
// parent's checkpoint under the fork's run ID are refused before anything
// is written or reported.
func TestForkRefusesAForeignOrTamperedCheckpoint(t *testing.T) {
	h, _, spec, _ := pauseHost(t, &runtest.StepLog{})
	ran := make(chan error, 1)
	go func() { _, err := h.Run(t.Context(), spec); ran <- err }()
	out := pauseLive(t, h)
	require.ErrorIs(t, <-ran, executor.ErrPaused)
	m := *out.Checkpoint
	fs, rec := forkSpec(spec, "f1", "x")

	otherTenant := m
	otherTenant.Tenant = "v"
	_, err := h.Fork(t.Context(), fs, executor.ForkFrom{Checkpoint: &otherTenant})
	require.ErrorIs(t, err, checkpoint.ErrForeign)

	otherParent := fs
	otherParent.Run = &model.TaskRun{ID: "f1", TaskID: "t", ParentRunID: "r9"}
	_, err = h.Fork(t.Context(), otherParent, executor.ForkFrom{Checkpoint: &m})
	require.ErrorIs(t, err, checkpoint.ErrForeign, "the checkpoint names r1, not the parent the fork names")

	asResume := fs
	asResume.Run = &model.TaskRun{ID: "f1", TaskID: "t"}
	_, err = h.Resume(t.Context(), asResume, m)
	require.ErrorIs(t, err, checkpoint.ErrForeign, "only a fork restores a checkpoint under another run ID")

	_, err = h.Fork(t.Context(), fs, executor.ForkFrom{State: &executor.ForkState{Object: "../../r9/state.tar.gz", SHA256: "00"}})
	require.ErrorIs(t, err, checkpoint.ErrForeign)
	_, err = h.Fork(t.Context(), fs, executor.ForkFrom{State: &executor.ForkState{Object: executor.SessionStateName, SHA256: strings.Repeat("0", 64)}})
	require.ErrorIs(t, err, executor.ErrForkState, "a state that is not the one the record names")

	ref := model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r1"}
	_, err = h.Store().PutRunFile(t.Context(), ref, checkpoint.ArchiveObject, strings.NewReader("not the checkpoint"), "application/zstd")
	require.NoError(t, err)
	_, err = h.Fork(t.Context(), fs, executor.ForkFrom{Checkpoint: &m})
	require.ErrorIs(t, err, checkpoint.ErrDigest)

	assert.Empty(t, rec.Patches(), "nothing is reported for a refused fork")
	assert.NoDirExists(t, h.Layout().Paths().RuntimeTaskRunDir("u", "c", "t", "f1"))
}

// A live run forked from a fork point goes on unaffected: its home is
// stored as it is, and the forks start in copies of it. A finished run
// forks from its session state, checked against its record.
func TestForkALiveAndAFinishedRun(t *testing.T) {
	h, spec := forkFilesHost(t)
	live := &syncWriter{w: &strings.Builder{}}
	spec.Stdout = live
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan *executor.Outcome, 1)
	go func() { out, _ := h.Run(ctx, spec); ran <- out }()
	var from executor.ForkFrom
	require.Eventually(t, func() bool {
		var err error
		from, err = h.ForkPoint(t.Context(), "r1")
		return err == nil && strings.Contains(live.String(), "step1")
	}, 30*time.Second, 5*time.Millisecond)
	// The fork point taken once step1 was printed holds progress.
	from, err := h.ForkPoint(t.Context(), "r1")
	require.NoError(t, err)
	outs := forkAll(t, h, spec, from, 2)
	for id, o := range outs {
		assert.Equal(t, model.StatusSucceeded, o.Status, o.Reason)
		assert.Equal(t, id+" after step1\n", o.Result.OutputStr)
	}
	select {
	case out := <-ran:
		t.Fatalf("the parent ended while it was forked: %s %s", out.Status, out.Reason)
	default:
	}
	cancel()
	parent := <-ran
	assert.Equal(t, "step1\n", parent.Result.OutputStr, "the parent went on alone")

	// f1 ended: a fork of its final state, checked against its record.
	var state persist.ObjectInfo
	for _, o := range outs["f1"].Stored {
		if strings.HasSuffix(o.Key, "/"+executor.SessionStateName) {
			state = o
		}
	}
	require.NotEmpty(t, state.SHA256)
	fs, _ := forkSpec(spec, "g1", "g1")
	fs.Run.ParentRunID = "f1"
	o, err := h.Fork(t.Context(), fs, executor.ForkFrom{State: &executor.ForkState{Object: executor.SessionStateName, SHA256: state.SHA256}})
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, o.Status, o.Reason)
	patch := runPatch(t, h, "g1")
	assert.Contains(t, patch, "+++ b/f1.txt", "the finished parent's change is in the fork's change set")
	assert.Contains(t, patch, "+++ b/g1.txt")
}
