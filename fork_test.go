package taskrun_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// forkScript marks its home once, counts to 60 with the counter only in
// its shell's memory, and then writes a file named by its prompt (read
// once it counted: a fork reads its own) into its home.
const forkScript = `[ -e /taskrun/home/progress ] || echo started >/taskrun/home/progress; i=0; ` +
	`while [ $i -lt 60 ]; do i=$((i+1)); echo $i; sleep 0.05; done; ` +
	`p=$(cat /taskrun/prompt.txt); echo "$p counted to $i" >/taskrun/home/$p.txt`

// Four forks of one checkpoint of a real run each produce a change set of
// their own against the original workspace, and the parent, resumed
// afterwards, is unaffected: on gVisor the checkpoint keeps memory and
// every fork goes on counting where the parent stopped; on runc it keeps
// files only and every fork counts again in a copy of the parent's home.
func TestFourForksOfARealRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		runtime string
		kind    sandbox.CheckpointKind
	}{
		{"runsc memory", sandbox.RuntimeGVisor, sandbox.CheckpointMemory},
		{"runc files", sandbox.DefaultPolicy().Runtime, sandbox.CheckpointFiles},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := runtest.New(t, runtest.Options{Dir: t.TempDir(), HelpersDir: testbin.Dir(t)})
			if tc.kind == sandbox.CheckpointMemory && env.Backend.Capabilities().CheckpointsFor(tc.runtime) != sandbox.CheckpointMemory {
				msg := "the engine has no memory checkpoints: runsc and taskrun-runsc-restore must be registered (scripts/test-setup.sh)"
				if os.Getenv("TASKRUN_REQUIRE_RUNSC") == "1" {
					t.Fatal(msg)
				}
				t.Skip(msg)
			}
			ctx := t.Context()
			ws := t.TempDir()
			require.NoError(t, os.WriteFile(ws+"/base.txt", []byte("the original workspace\n"), 0o644))
			pol := sandbox.DefaultPolicy()
			pol.Runtime = tc.runtime
			live := &lockedBuffer{}
			spec := executor.Spec{
				Task:      &model.Task{ID: env.TaskID, UserID: env.Tenant, ConversationID: env.ConversationID, Prompt: "parent", WorkspaceDir: ws},
				Run:       &model.TaskRun{ID: "parent1", TaskID: env.TaskID},
				SessionID: env.SessionID, Updater: &controlplanetest.Recorder{}, Image: testImage,
				Command: []string{"sh", "-c", forkScript}, Policy: &pol, Labels: env.Labels, Stdout: live,
			}
			ran := make(chan error, 1)
			go func() { _, err := env.Host.Run(ctx, spec); ran <- err }()
			for strings.Count(live.String(), "\n") < 10 {
				select {
				case err := <-ran:
					t.Fatalf("the run ended before it was paused: %v", err)
				case <-time.After(50 * time.Millisecond):
				}
			}
			var out *executor.Outcome
			for {
				var err error
				if out, err = env.Host.Pause(ctx, "parent1"); !errors.Is(err, executor.ErrNotLive) {
					require.NoError(t, err)
					break
				}
			}
			require.ErrorIs(t, <-ran, executor.ErrPaused)
			require.Equal(t, tc.kind, out.Checkpoint.Kind, out.Reason)
			before, err := env.RunFile(ctx, "parent1", executor.OutputLogName)
			require.NoError(t, err)

			var wg sync.WaitGroup
			outs := make([]*executor.Outcome, 4)
			began := time.Now()
			for i := range outs {
				id := fmt.Sprintf("fork%d", i+1)
				task := *spec.Task
				task.Prompt = id
				fs := spec
				fs.Task, fs.Stdout, fs.Updater = &task, nil, &controlplanetest.Recorder{}
				fs.Run = &model.TaskRun{ID: id, TaskID: env.TaskID, ParentRunID: "parent1"}
				wg.Go(func() {
					o, err := env.Host.Fork(ctx, fs, executor.ForkFrom{Checkpoint: out.Checkpoint})
					assert.NoError(t, err, "fork %s", id)
					outs[i] = o
				})
			}
			wg.Wait()
			t.Logf("4 forks, to their end: %v", time.Since(began))
			var counted strings.Builder
			for i := 1; i <= 60; i++ {
				fmt.Fprintf(&counted, "%d\n", i)
			}
			for i, o := range outs {
				id := fmt.Sprintf("fork%d", i+1)
				require.NotNil(t, o, id)
				assert.Equal(t, model.StatusSucceeded, o.Status, "%s: %s", id, o.Reason)
				log, err := env.RunFile(ctx, id, executor.OutputLogName)
				require.NoError(t, err)
				if tc.kind == sandbox.CheckpointMemory {
					assert.True(t, strings.HasPrefix(string(log), string(before)), "%s goes on from the parent's output", id)
				}
				assert.Equal(t, counted.String(), string(log), "%s counted to 60, every value once", id)
				patch, err := env.RunFile(ctx, id, executor.ChangesPatchName)
				require.NoError(t, err)
				assert.Contains(t, string(patch), "+++ b/"+id+".txt")
				assert.Contains(t, string(patch), id+" counted to 60")
				assert.Contains(t, string(patch), "+++ b/progress", "against the original workspace")
				assert.NotContains(t, string(patch), "base.txt")
				for j := range outs {
					if j != i {
						assert.NotContains(t, string(patch), fmt.Sprintf("fork%d.txt", j+1))
					}
				}
				isolation, err := env.RunFile(ctx, id, executor.AuditRecordName)
				require.NoError(t, err)
				var rec struct {
					ParentRunID string `json:"parent_run_id"`
				}
				require.NoError(t, json.Unmarshal(isolation, &rec))
				assert.Equal(t, "parent1", rec.ParentRunID, "%s's isolation record names its parent", id)
			}

			resumed, err := env.Host.Resume(ctx, spec, *out.Checkpoint)
			require.NoError(t, err)
			assert.Equal(t, model.StatusSucceeded, resumed.Status, resumed.Reason)
			patch, err := env.RunFile(ctx, "parent1", executor.ChangesPatchName)
			require.NoError(t, err)
			assert.Contains(t, string(patch), "parent counted to 60")
			assert.NotContains(t, string(patch), "fork1.txt", "the parent holds none of its forks' changes")
			if tc.kind == sandbox.CheckpointMemory {
				log, err := env.RunFile(ctx, "parent1", executor.OutputLogName)
				require.NoError(t, err)
				assert.Equal(t, counted.String(), string(log), "the parent goes on as if it had not been forked")
			}
			left, err := env.Containers(ctx)
			require.NoError(t, err)
			assert.Empty(t, left)
		})
	}
}
