package taskrun_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// runningProbe calls onRunning when the RUNNING status is reported, while
// the container runs.
type runningProbe struct {
	*controlplanetest.Recorder
	once      sync.Once
	onRunning func()
}

func (p *runningProbe) UpdateRunStatus(ctx context.Context, id string, req *workerclient.PatchTaskRunRequest) error {
	if req.Status == model.StatusRunning {
		p.once.Do(p.onRunning)
	}
	return p.Recorder.UpdateRunStatus(ctx, id, req)
}

// containerNames returns the names of the live containers of runID.
func containerNames(t *testing.T, runID string) []string {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	defer cli.Close()
	list, err := cli.ContainerList(context.Background(), container.ListOptions{
		Filters: filters.NewArgs(filters.Arg("label", sandbox.LabelRun+"="+runID)),
	})
	require.NoError(t, err)
	var names []string
	for _, c := range list {
		names = append(names, c.Names...)
	}
	return names
}

// A run stores its change set (patch and list, session-state excludes
// included), names it in the final PATCH
// and in Outcome.Stored, runs in a container named after it, and writes its
// run index record: RUNNING while the container runs, then its final status
// with the stored keys.
func TestRunTaskStoresChangeSetAndIndexesTheRun(t *testing.T) {
	h := newHarness(t)
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "main.go"), []byte("package main\n// TODO\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "old.txt"), []byte("old\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "run.sh"), []byte("#!/bin/sh\n"), 0o644))
	runID := "chg-" + h.Tenant
	var whileRunning *runindex.Record
	var names []string
	probe := &runningProbe{Recorder: &controlplanetest.Recorder{}, onRunning: func() {
		whileRunning, _ = runindex.Find(context.Background(), h.Store, runID, h.Tenant)
		names = containerNames(t, runID)
	}}
	in := h.input(probe.Recorder, runID, "sh", "-c", `
printf 'package main\n// done\n' > main.go
rm old.txt
chmod +x run.sh
echo new > new.txt
mkdir -p .cache && echo cached > .cache/x
sleep 1
echo changed`)
	in.Updater = probe
	in.Task.WorkspaceDir = ws

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)

	require.NotNil(t, whileRunning, "a RUNNING record is in the index while the container runs")
	assert.Equal(t, model.StatusRunning, whileRunning.Status)
	assert.Equal(t, []string{"/taskrun-" + runID}, names)

	patch := h.runFile(t, runID, taskrun.ChangesPatchName)
	assert.Contains(t, patch, "-// TODO\n+// done\n")
	assert.Contains(t, patch, "deleted file mode 100644")
	assert.Contains(t, patch, "old mode 100644\nnew mode 100755\n")
	var set changeset.Set
	require.NoError(t, json.Unmarshal([]byte(h.runFile(t, runID, taskrun.ChangesListName)), &set))
	assert.Equal(t, changeset.Summary{Files: 5, Added: 2, Deleted: 1, Modified: 1, ModeChanged: 1,
		Insertions: 3, Deletions: 2, PatchBytes: int64(len(patch))}, set.Summary)
	assert.Contains(t, patch, "+++ b/.cache/x\n", "session-state excludes do not hide changes")

	require.NotNil(t, out.Changes)
	assert.True(t, strings.HasSuffix(out.Changes.Patch.Key, "/runs/"+runID+"/changes.patch"), out.Changes.Patch.Key)
	assert.Equal(t, set.TreeHash, out.Changes.TreeHash)
	var storedKeys []string
	for _, o := range out.Stored {
		storedKeys = append(storedKeys, o.Key)
	}
	assert.Contains(t, storedKeys, out.Changes.Patch.Key)
	assert.Contains(t, storedKeys, out.Changes.List.Key)

	final := last(t, probe.Recorder)
	require.NotNil(t, final.Changes)
	assert.Equal(t, *out.Changes, *final.Changes)

	rec, err := runindex.Find(context.Background(), h.Store, runID, "")
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, rec.Status)
	assert.Equal(t, out.Changes.Patch.Key, rec.Keys.Patch)
	assert.Equal(t, out.Changes.List.Key, rec.Keys.Changes)
	assert.NotEmpty(t, rec.Keys.Log)
	assert.NotEmpty(t, rec.Keys.State)
	assert.NotEmpty(t, rec.Keys.Audit)
	assert.NotEmpty(t, rec.ImageDigest)
	assert.Equal(t, "taskrun-"+runID, rec.ContainerName)
	assert.Equal(t, set.TreeHash, rec.Changes.TreeHash)
	assert.Equal(t, whileRunning.Start, rec.Start, "one record per run: the final one replaces the RUNNING one")
	require.NotNil(t, rec.ExitCode)
	assert.Equal(t, 0, *rec.ExitCode)
	recs, err := runindex.List(context.Background(), h.Store, runindex.Filter{UserID: h.Tenant})
	require.NoError(t, err)
	assert.Len(t, recs, 1)
}
