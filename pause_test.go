package taskrun_test

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// pauseScript counts to 150, the counter only in the shell's memory, and
// prints with each value the next line of a file on its /tmp tmpfs, read
// through a descriptor it keeps open: both are state the sandbox holds.
const pauseScript = `seq 1 1000 | sed 's/^/line/' >/tmp/input; exec 3</tmp/input; i=0; ` +
	`while [ $i -lt 150 ]; do i=$((i+1)); read -r l <&3; echo "$i $l"; sleep 0.05; done`

// lockedBuffer is a live stdout copy the test reads while the run writes.
type lockedBuffer struct {
	mu sync.Mutex
	sb strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.String()
}

// A gVisor run with the self-check, whose state lives only in its sandbox,
// is paused through its host: it ends PAUSED, its checkpoint stored with the run, and the
// host holds nothing of it (container, run directory, journal record).
// Another host, with another runs root and the same store, resumes it: it
// goes on from its counter and its file offset, and its output log and
// stream have every line once, in order.
func TestPauseAndResumeARunOnAnotherHost(t *testing.T) {
	dir1 := t.TempDir()
	env1 := runtest.New(t, runtest.Options{Dir: dir1, HelpersDir: testbin.Dir(t)})
	if env1.Backend.Capabilities().CheckpointsFor(sandbox.RuntimeGVisor) != sandbox.CheckpointMemory {
		msg := "the engine has no memory checkpoints: runsc and taskrun-runsc-restore must be registered (scripts/test-setup.sh)"
		if os.Getenv("TASKRUN_REQUIRE_RUNSC") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	env2 := runtest.New(t, runtest.Options{Dir: t.TempDir(), StoreURL: "file://" + filepath.Join(dir1, "store"), Tenant: env1.Tenant, HelpersDir: testbin.Dir(t)})
	ctx := t.Context()
	pol := sandbox.DefaultPolicy()
	pol.Runtime = sandbox.RuntimeGVisor
	rec := &controlplanetest.Recorder{}
	live := &lockedBuffer{}
	spec := executor.Spec{
		Task:      &model.Task{ID: env1.TaskID, UserID: env1.Tenant, ConversationID: env1.ConversationID},
		Run:       &model.TaskRun{ID: "paused1", TaskID: env1.TaskID},
		SessionID: env1.SessionID, Updater: rec, StreamSender: rec,
		Image: testImage, Command: []string{"sh", "-c", pauseScript}, Policy: &pol,
		Labels: env1.Labels, Stdout: live,
	}
	ran := make(chan error, 1)
	go func() { _, err := env1.Host.Run(ctx, spec); ran <- err }()
	for strings.Count(live.String(), "\n") < 20 {
		select {
		case err := <-ran:
			t.Fatalf("the run ended before it was paused: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	var out *executor.Outcome
	for {
		var err error
		began := time.Now()
		out, err = env1.Host.Pause(ctx, "paused1")
		if errors.Is(err, executor.ErrNotLive) {
			continue
		}
		require.NoError(t, err)
		t.Logf("pause (checkpoint, store, collect, release): %v, archive %d bytes", time.Since(began), out.Checkpoint.Size)
		break
	}
	require.ErrorIs(t, <-ran, executor.ErrPaused)
	assert.Equal(t, model.StatusPaused, out.Status, out.Reason)
	require.NotNil(t, out.Checkpoint)
	assert.Equal(t, sandbox.CheckpointMemory, out.Checkpoint.Kind)
	assert.Equal(t, model.StatusPaused, rec.Patches()[len(rec.Patches())-1].Status)
	assert.NoDirExists(t, env1.RunDir("paused1"), "the paused run's files left the host")
	left, err := env1.Containers(ctx, "paused1")
	require.NoError(t, err)
	assert.Empty(t, left, "the paused run's container is gone")
	before, err := env1.RunFile(ctx, "paused1", executor.OutputLogName)
	require.NoError(t, err)
	assert.Equal(t, int64(len(before)), out.Checkpoint.StdoutOffset)

	began := time.Now()
	resumed, err := env2.Host.Resume(ctx, spec, *out.Checkpoint)
	require.NoError(t, err, "resume: %+v", resumed)
	t.Logf("resumed run, to its end: %v", time.Since(began))
	assert.Equal(t, model.StatusSucceeded, resumed.Status)
	log, err := env2.RunFile(ctx, "paused1", executor.OutputLogName)
	require.NoError(t, err)
	var want strings.Builder
	for i := 1; i <= 150; i++ {
		fmt.Fprintf(&want, "%d line%d\n", i, i)
	}
	assert.Equal(t, want.String(), string(log), "the output log has every line once, in order")
	stream, _, _ := rec.Stream()
	assert.Equal(t, want.String(), string(stream), "so has the stream")
	assert.Equal(t, want.String(), live.String(), "so has the live copy")
}

// A checkpoint changed in the store is refused before the resume writes or
// reports anything: the run stays PAUSED.
func TestResumeRefusesATamperedCheckpointOfARealRun(t *testing.T) {
	env := runtest.New(t, runtest.Options{Dir: t.TempDir()})
	if env.Backend.Capabilities().CheckpointsFor(sandbox.RuntimeGVisor) != sandbox.CheckpointMemory {
		t.Skip("the engine has no memory checkpoints (scripts/test-setup.sh)")
	}
	ctx := context.Background()
	pol := sandbox.DefaultPolicy()
	pol.Runtime = sandbox.RuntimeGVisor
	rec := &controlplanetest.Recorder{}
	live := &lockedBuffer{}
	spec := executor.Spec{
		Task:      &model.Task{ID: env.TaskID, UserID: env.Tenant, ConversationID: env.ConversationID},
		Run:       &model.TaskRun{ID: "tampered1", TaskID: env.TaskID},
		SessionID: env.SessionID, Updater: rec, Image: testImage, Command: []string{"sh", "-c", pauseScript}, Policy: &pol,
		Labels: env.Labels, Stdout: live,
	}
	ran := make(chan error, 1)
	go func() { _, err := env.Host.Run(ctx, spec); ran <- err }()
	for strings.Count(live.String(), "\n") < 5 {
		time.Sleep(50 * time.Millisecond)
	}
	var out *executor.Outcome
	for {
		var err error
		if out, err = env.Host.Pause(ctx, "tampered1"); !errors.Is(err, executor.ErrNotLive) {
			require.NoError(t, err)
			break
		}
	}
	require.ErrorIs(t, <-ran, executor.ErrPaused)
	_, err := env.Store.PutRunFile(ctx, env.Ref("tampered1"), checkpoint.ArchiveObject, strings.NewReader("planted"), "application/zstd")
	require.NoError(t, err)
	reports := len(rec.Patches())
	_, err = env.Host.Resume(ctx, spec, *out.Checkpoint)
	require.ErrorIs(t, err, checkpoint.ErrDigest)
	assert.Len(t, rec.Patches(), reports, "a refused resume reports nothing: the run stays PAUSED")
	left, err := env.Containers(ctx, "tampered1")
	require.NoError(t, err)
	assert.Empty(t, left)
}
