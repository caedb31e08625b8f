package executor_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/servertest"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/workerclient"
)

// A journaled attempt recovered after its run ended on the control plane
// (reported by the same attempt, or finalized "worker lost") stores nothing
// and reports nothing: the real control plane refuses its lease.
func TestRecoveredAttemptNeverWritesOverAnEndedRun(t *testing.T) {
	for _, tc := range []struct {
		name       string
		end        func(t *testing.T, s *servertest.Server, w *workerclient.Client, a *workerclient.Assignment)
		wantStatus model.RunStatus
		wantError  string
	}{
		{
			name: "succeeded",
			end: func(t *testing.T, _ *servertest.Server, w *workerclient.Client, a *workerclient.Assignment) {
				ctx := context.Background()
				f := w.Fenced(a.Lease)
				require.NoError(t, f.Stream().Send(ctx, a.Run.ID, workerclient.Delta{Data: []byte("the first attempt's output\n")}))
				require.NoError(t, f.Stream().End(ctx, a.Run.ID, 27))
				now := time.Now().UnixMilli()
				require.NoError(t, f.UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded, EndedAt: &now}))
			},
			wantStatus: model.StatusSucceeded,
		},
		{
			name: "worker lost",
			end: func(t *testing.T, s *servertest.Server, _ *workerclient.Client, _ *workerclient.Assignment) {
				s.Advance(time.Hour)
				require.Len(t, s.Sweep(t), 1)
			},
			wantStatus: model.StatusFailed,
			wantError:  "worker lost",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := servertest.Start(t, servertest.Options{})
			sub, err := s.User.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
			require.NoError(t, err)
			w := workerclient.New(s.URL, servertest.WorkerToken)
			a, err := w.AcquireLease(ctx, workerclient.LeaseRequest{WorkerID: "w1", Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1}})
			require.NoError(t, err)
			require.NotNil(t, a)
			require.Equal(t, sub.RunID, a.Run.ID)
			tc.end(t, s, w, a)
			before, err := s.User.GetRun(ctx, a.Run.ID)
			require.NoError(t, err)
			require.Equal(t, tc.wantStatus, before.Status)

			// The run's attempt, journaled with its lease, left output on
			// this host when its executor died.
			root := t.TempDir()
			storeURL := "file://" + filepath.Join(t.TempDir(), "store")
			h, err := executor.New(ctx, executor.Config{Root: root, Token: servertest.WorkerToken, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			task := a.Task
			paths := h.Layout().Paths()
			runDir := paths.RuntimeTaskRunDir(task.UserID, task.ConversationID, task.ID, a.Run.ID)
			for _, dir := range []string{
				paths.RuntimeTaskRunHomeDir(task.UserID, task.ConversationID, task.ID, a.Run.ID),
				paths.RuntimeTaskRunArtifactsDir(task.UserID, task.ConversationID, task.ID, a.Run.ID),
				paths.RuntimeTaskRunGlobalDir(task.UserID, task.ConversationID, task.ID, a.Run.ID),
				paths.RunOutputDir(task.UserID, task.ConversationID, task.ID, a.Run.ID),
			} {
				require.NoError(t, os.MkdirAll(dir, 0o755))
			}
			require.NoError(t, os.MkdirAll(runDir+".executor", 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(runDir+".executor", "stdout.log"), []byte("the recovered attempt's output\n"), 0o600))
			rec := journal.Record{
				RunID: a.Run.ID, UserID: task.UserID, ConversationID: task.ConversationID, TaskID: task.ID, SessionID: a.SessionID,
				RunDir: runDir, SpoolDir: runDir + ".executor", Store: storeURL, Phase: journal.PhaseSupervise, ContainerID: "the-dead-executors-container",
				ControlPlane: &journal.ControlPlane{URL: s.URL, Fence: a.Lease.Epoch, LeaseToken: a.Lease.Token},
				StartedAt:    time.Now().Add(-time.Minute), UpdatedAt: time.Now(),
			}

			in, closeFn, err := h.RecoveryInput(ctx, rec)
			require.NoError(t, err)
			_, err = executor.RecoverRun(ctx, in, rec)
			closeFn()
			require.NoError(t, err, "a refused lease ends the recovery: nothing is left to retry")

			store, err := persist.Open(ctx, storeURL)
			require.NoError(t, err)
			defer store.Close()
			keys, err := store.List(ctx, "")
			require.NoError(t, err)
			assert.Empty(t, keys, "nothing of the recovered attempt is stored")

			after, err := s.User.GetRun(ctx, a.Run.ID)
			require.NoError(t, err)
			assert.Equal(t, tc.wantStatus, after.Status, "no terminal report of the recovered attempt was accepted")
			assert.Equal(t, before.Error, after.Error)
			if tc.wantError != "" {
				assert.Contains(t, after.Error, tc.wantError)
			}
			assert.Equal(t, before.EndedAt, after.EndedAt)
			out, err := s.User.Output(ctx, a.Run.ID, 0, false)
			require.NoError(t, err)
			data, err := io.ReadAll(out)
			out.Close()
			require.NoError(t, err)
			assert.NotContains(t, string(data), "recovered", "none of the recovered attempt's output was streamed")
		})
	}
}
