package executor_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// A run stores its change set (patch and list), names it in the final
// PATCH and in Outcome.Stored, and writes its run index record: RUNNING
// while the agent runs, then its final status with the stored keys.
func TestPhasesChangeSetAndRunIndex(t *testing.T) {
	u := newUnit(t)
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "main.go"), []byte("package main\n// TODO\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "old.txt"), []byte("old\n"), 0o644))
	var whileRunning *runindex.Record
	in := u.input("chg1", func(ctx context.Context, p *sandboxfake.Process) int {
		// The RUNNING record is written in the background: wait for it. It
		// takes milliseconds; the deadline bounds a record never written.
		for deadline := time.Now().Add(testdeadline.Scale(10 * time.Second)); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if rec, err := runindex.Find(ctx, u.store, "chg1", "user1"); err == nil {
				whileRunning = rec
				break
			}
		}
		if err := p.WriteFile("/taskrun/home/main.go", []byte("package main\n// done\n")); err != nil {
			return 1
		}
		if err := p.WriteFile("/taskrun/home/new.txt", []byte("new\n")); err != nil {
			return 1
		}
		old, _, _ := p.HostPath("/taskrun/home/old.txt")
		if os.Remove(old) != nil {
			return 1
		}
		write(p.Stdout, "changed\n")
		return 0
	})
	in.Task.WorkspaceDir = ws

	out, err := executor.Execute(context.Background(), in)
	require.NoError(t, err)

	require.NotNil(t, whileRunning, "a RUNNING record is in the index while the agent runs")
	assert.Equal(t, model.StatusRunning, whileRunning.Status)
	assert.Equal(t, "taskrun-chg1", whileRunning.ContainerName)

	patch := u.runFile(t, "chg1", executor.ChangesPatchName)
	assert.Contains(t, patch, "-// TODO\n+// done\n")
	assert.Contains(t, patch, "deleted file mode 100644")
	var set changeset.Set
	require.NoError(t, json.Unmarshal([]byte(u.runFile(t, "chg1", executor.ChangesListName)), &set))
	assert.Equal(t, changeset.Summary{Files: 3, Added: 1, Deleted: 1, Modified: 1, Insertions: 2, Deletions: 2, PatchBytes: int64(len(patch))}, set.Summary)

	require.NotNil(t, out.Changes)
	assert.True(t, strings.HasSuffix(out.Changes.Patch.Key, "/runs/chg1/changes.patch"), out.Changes.Patch.Key)
	assert.Equal(t, set.TreeHash, out.Changes.TreeHash)
	var storedKeys []string
	for _, o := range out.Stored {
		storedKeys = append(storedKeys, o.Key)
	}
	assert.Contains(t, storedKeys, out.Changes.Patch.Key)
	assert.Contains(t, storedKeys, out.Changes.List.Key)

	final := u.final(t)
	require.NotNil(t, final.Changes)
	assert.Equal(t, *out.Changes, *final.Changes)
	assert.Equal(t, 3, final.Changes.Files)

	rec, err := runindex.Find(context.Background(), u.store, "chg1", "")
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, rec.Status)
	assert.Equal(t, out.Changes.Patch.Key, rec.Keys.Patch)
	assert.Equal(t, out.Changes.List.Key, rec.Keys.Changes)
	assert.NotEmpty(t, rec.Keys.Log)
	assert.NotEmpty(t, rec.Keys.State)
	assert.NotEmpty(t, rec.Keys.Audit)
	assert.Equal(t, set.TreeHash, rec.Changes.TreeHash)
	assert.Equal(t, whileRunning.Start, rec.Start, "one record per run: the final one replaces the RUNNING one")
	require.NotNil(t, rec.ExitCode)
	assert.Equal(t, 0, *rec.ExitCode)
	assert.False(t, rec.End.Before(rec.Start))
	recs, err := runindex.List(context.Background(), u.store, runindex.Filter{UserID: "user1"})
	require.NoError(t, err)
	assert.Len(t, recs, 1)
}

// A run whose agent fails still stores its change set and indexes FAILED.
func TestPhasesFailedRunIsIndexedWithItsChanges(t *testing.T) {
	u := newUnit(t)
	in := u.input("chg2", func(_ context.Context, p *sandboxfake.Process) int {
		_ = p.WriteFile("/taskrun/home/partial.txt", []byte("half done\n"))
		return 3
	})
	_, err := executor.Execute(context.Background(), in)
	require.Error(t, err)
	assert.Contains(t, u.runFile(t, "chg2", executor.ChangesPatchName), "+half done")
	rec, err := runindex.Find(context.Background(), u.store, "chg2", "user1")
	require.NoError(t, err)
	assert.Equal(t, model.StatusFailed, rec.Status)
	assert.Contains(t, rec.Reason, "exited with code 3")
	require.NotNil(t, rec.ExitCode)
	assert.Equal(t, 3, *rec.ExitCode)
}
