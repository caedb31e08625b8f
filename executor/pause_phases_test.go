package executor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
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
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// checkpointingFake is the fake backend with memory checkpoints: a
// checkpoint writes the counter its agent holds into the checkpoint
// directory and stops the agent (exit 0, as a checkpointed sandbox's
// Wait); a restore starts the agent again from that counter.
type checkpointingFake struct {
	*sandboxfake.Backend
	mu sync.Mutex
	// counter is the live agent's state; stop ends it.
	counter int
	stop    chan struct{}
}

func (f *checkpointingFake) Capabilities() sandbox.Capabilities {
	c := f.Backend.Capabilities()
	c.Checkpoints = map[string]sandbox.CheckpointKind{sandbox.DefaultPolicy().Runtime: sandbox.CheckpointMemory}
	return c
}

func (f *checkpointingFake) Checkpoint(_ context.Context, _ sandbox.Handle, dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := os.WriteFile(filepath.Join(dir, "counter"), []byte(strconv.Itoa(f.counter)), 0o600); err != nil {
		return err
	}
	close(f.stop)
	return nil
}

func (f *checkpointingFake) Create(ctx context.Context, spec sandbox.Spec, pol sandbox.Policy) (sandbox.Created, error) {
	if spec.RestoreFrom != "" {
		raw, err := os.ReadFile(filepath.Join(spec.RestoreFrom, "counter"))
		if err != nil {
			return nil, err
		}
		from, err := strconv.Atoi(string(raw))
		if err != nil {
			return nil, err
		}
		f.Install("/agent/restored", f.counting(from, 6))
		spec.RestoreFrom, spec.Cmd, spec.Entrypoint, spec.Wrapper = "", []string{"/agent/restored"}, nil, nil
	}
	return f.Backend.Create(ctx, spec, pol)
}

// counting is an agent that prints a counter from from, holding it only
// in memory, until it is checkpointed or reaches until.
func (f *checkpointingFake) counting(from, until int) sandboxfake.Program {
	return func(ctx context.Context, p *sandboxfake.Process) int {
		f.mu.Lock()
		f.stop = make(chan struct{})
		stop := f.stop
		f.mu.Unlock()
		for i := from; i < until; i++ {
			f.mu.Lock()
			select {
			case <-stop:
				f.mu.Unlock()
				return 0
			default:
			}
			fmt.Fprintf(p.Stdout, "%d\n", i)
			f.counter = i + 1
			f.mu.Unlock()
			if i == 2 && from == 0 {
				<-stop // waits at 3 for its pause
				return 0
			}
		}
		return 0
	}
}

// pauseHost is a host on the checkpointing fake whose run counts from 0.
func pauseHost(t *testing.T, steps *runtest.StepLog) (*executor.Host, *checkpointingFake, executor.Spec, *controlplanetest.Recorder) {
	t.Helper()
	f := &checkpointingFake{Backend: sandboxfake.New(sandboxfake.WithMaxStopGrace(time.Millisecond))}
	f.Install("/agent/count", f.counting(0, 6))
	h, err := executor.New(t.Context(), executor.Config{
		Root: t.TempDir(), Backend: f, Store: memStore(t), Logger: slog.New(steps),
		Defaults: executor.Defaults{Image: "fake/agent", DiskLimitBytes: -1, Command: []string{"/agent/count"}},
	})
	require.NoError(t, err)
	rec := &controlplanetest.Recorder{}
	spec := executor.Spec{
		Task: &model.Task{ID: "t", UserID: "u", ConversationID: "c"}, Run: &model.TaskRun{ID: "r1", TaskID: "t"}, SessionID: "s",
		Updater: rec, StreamSender: rec,
	}
	return h, f, spec, rec
}

// pauseLive pauses the run once its container is live.
func pauseLive(t *testing.T, h *executor.Host) *executor.Outcome {
	t.Helper()
	for {
		out, err := h.Pause(t.Context(), "r1")
		if errors.Is(err, executor.ErrNotLive) {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		require.NoError(t, err)
		return out
	}
}

// A pause checkpoints the live sandbox and stores the checkpoint before
// anything else of the run ends; then the run ends as any run does, its
// verdict PAUSED journaled before its outputs are stored, everything it
// held on the host released, PAUSED reported, and its journal record
// removed. Resumed, it goes on from its counter, its output log whole.
func TestPauseOrderAndResume(t *testing.T) {
	steps := &runtest.StepLog{}
	h, _, spec, rec := pauseHost(t, steps)
	live := &syncWriter{w: &strings.Builder{}}
	spec.Stdout = live
	ran := make(chan error, 1)
	var first *executor.Outcome
	go func() {
		var err error
		first, err = h.Run(t.Context(), spec)
		ran <- err
	}()
	out := pauseLive(t, h)
	require.ErrorIs(t, <-ran, executor.ErrPaused)
	assert.Equal(t, model.StatusPaused, first.Status)
	assert.Equal(t, model.StatusPaused, out.Status)
	require.NotNil(t, out.Checkpoint)
	assert.Equal(t, int64(len("0\n1\n2\n")), out.Checkpoint.StdoutOffset)
	assert.Equal(t, model.StatusPaused, rec.Patches()[len(rec.Patches())-1].Status)

	got := withoutRunning(t, steps.Take())
	assert.Equal(t, []string{
		"prestart:uid", "prestart:rundir", "create", "prestart:dirs", "prestart:isolation", "prestart:workspace", "prestart:changes", "prestart:output", "prestart:gateway",
		"poststart:isolation", "started", "poststart:output", "poststart:metrics",
		"pause:checkpoint", "pause:store",
		"exited:isolation", "exited:output", "exited:gateway", "exited:metrics", "remove", "judged",
		"keep", "collect:files", "seal:files", "removed", "collected",
		"stop:gateway", "stop:output", "stop:rundir", "stop:uid", "reported", "ended",
	}, got)
	runDir := h.Layout().Paths().RuntimeTaskRunDir("u", "c", "t", "r1")
	assert.NoDirExists(t, runDir, "a paused run holds no files on the host")
	jd, err := h.Journal()
	require.NoError(t, err)
	recs, err := jd.List()
	require.NoError(t, err)
	assert.Empty(t, recs, "a paused run holds no journal record")
	ref := model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r1"}
	rc, err := h.Store().OpenRunFile(t.Context(), ref, checkpoint.ArchiveObject)
	require.NoError(t, err, "the checkpoint is an object of the run")
	rc.Close()

	resumed, err := h.Resume(t.Context(), spec, *out.Checkpoint)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, resumed.Status)
	assert.Equal(t, "0\n1\n2\n3\n4\n5\n", resumed.Result.OutputStr, "the stored output goes on without a gap or a repeat")
	assert.Equal(t, "0\n1\n2\n3\n4\n5\n", live.String(), "the live copy goes on from where it stopped")
}

// A checkpoint that was changed, or another run's, is refused before
// anything is written or reported: the run stays PAUSED.
func TestResumeRefusesATamperedOrForeignCheckpoint(t *testing.T) {
	h, _, spec, rec := pauseHost(t, &runtest.StepLog{})
	ran := make(chan error, 1)
	go func() { _, err := h.Run(t.Context(), spec); ran <- err }()
	out := pauseLive(t, h)
	require.ErrorIs(t, <-ran, executor.ErrPaused)
	m := *out.Checkpoint
	reports := len(rec.Patches())
	ref := model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r1"}
	runDir := h.Layout().Paths().RuntimeTaskRunDir("u", "c", "t", "r1")

	foreign := m
	foreign.Run = "r2"
	_, err := h.Resume(t.Context(), spec, foreign)
	require.ErrorIs(t, err, checkpoint.ErrForeign)

	looser := m
	pol := *m.Policy
	pol.MemoryBytes /= 2
	looser.Policy = &pol
	_, err = h.Resume(t.Context(), spec, looser)
	require.ErrorIs(t, err, checkpoint.ErrLooserPolicy)

	_, err = h.Store().PutRunFile(t.Context(), ref, checkpoint.ArchiveObject, strings.NewReader("not the checkpoint"), "application/zstd")
	require.NoError(t, err)
	_, err = h.Resume(t.Context(), spec, m)
	require.ErrorIs(t, err, checkpoint.ErrDigest)
	assert.Contains(t, err.Error(), "stays PAUSED")

	assert.Len(t, rec.Patches(), reports, "nothing is reported for a refused resume")
	assert.NoDirExists(t, runDir, "nothing is written for a refused resume")
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// Where the backend keeps no memory (the plain fake, as runc without
// CRIU), a pause keeps the run's files only and says so: the container is
// stopped, its home stored; a resume starts the command again in that
// home, its output going on after what the paused run printed.
func TestPauseKeepsFilesOnlyWithoutMemoryCheckpoints(t *testing.T) {
	fake := sandboxfake.New(sandboxfake.WithMaxStopGrace(time.Millisecond))
	fake.Install("/agent/files", func(ctx context.Context, p *sandboxfake.Process) int {
		prev, _ := p.ReadFile("/taskrun/home/progress")
		if len(prev) > 0 {
			fmt.Fprintf(p.Stdout, "again after %s\n", prev)
			return 0
		}
		if err := p.WriteFile("/taskrun/home/progress", []byte("step1")); err != nil {
			return 1
		}
		fmt.Fprintln(p.Stdout, "step1")
		<-ctx.Done()
		return 137
	})
	h, err := executor.New(t.Context(), executor.Config{
		Root: t.TempDir(), Backend: fake, Store: memStore(t), Logger: discard,
		Defaults: executor.Defaults{Image: "fake/agent", DiskLimitBytes: -1, Command: []string{"/agent/files"}},
	})
	require.NoError(t, err)
	rec := &controlplanetest.Recorder{}
	spec := executor.Spec{
		Task: &model.Task{ID: "t", UserID: "u", ConversationID: "c"}, Run: &model.TaskRun{ID: "r1", TaskID: "t"}, SessionID: "s",
		Updater: rec, StreamSender: rec,
	}
	ran := make(chan error, 1)
	go func() { _, err := h.Run(t.Context(), spec); ran <- err }()
	out := pauseLive(t, h)
	require.ErrorIs(t, <-ran, executor.ErrPaused)
	assert.Equal(t, model.StatusPaused, out.Status)
	assert.Equal(t, sandbox.CheckpointFiles, out.Checkpoint.Kind)
	assert.Contains(t, out.Reason, "keeps no memory")

	resumed, err := h.Resume(t.Context(), spec, *out.Checkpoint)
	require.NoError(t, err)
	assert.Equal(t, "step1\nagain after step1\n", resumed.Result.OutputStr)
	stream, _, _ := rec.Stream()
	assert.Equal(t, "step1\nagain after step1\n", string(stream))
}
