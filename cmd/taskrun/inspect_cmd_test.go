package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/persist/s3test"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/workspace"
)

// storedRun is a run stored the way the executor stores one, with a real
// change set and session state, but without running a container.
type storedRun struct {
	orig, home string
	rec        *runindex.Record
}

func storeFakeRun(t *testing.T, storeURL, user, task, runID string, start time.Time, status model.RunStatus) storedRun {
	t.Helper()
	ctx := context.Background()
	st, err := persist.Open(ctx, storeURL)
	require.NoError(t, err)
	defer st.Close()

	orig := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(orig, "main.go"), []byte("package main\n\n// TODO\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(orig, "old.txt"), []byte("old\n"), 0o644))
	home := t.TempDir()
	_, err = workspace.CopyTree(ctx, orig, home, workspace.CopyOptions{})
	require.NoError(t, err)
	base := filepath.Join(t.TempDir(), "base")
	require.NoError(t, changeset.Snapshot(ctx, home, base, changeset.Options{}))
	require.NoError(t, os.WriteFile(filepath.Join(home, "main.go"), []byte("package main\n\n// done\n"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(home, "old.txt")))
	require.NoError(t, os.WriteFile(filepath.Join(home, "new.sh"), []byte("#!/bin/sh\n"), 0o755))
	var patch bytes.Buffer
	set, err := changeset.Compute(ctx, base, home, &patch)
	require.NoError(t, err)
	setJSON, err := json.Marshal(set)
	require.NoError(t, err)
	var state bytes.Buffer
	_, err = workspace.PackHome(ctx, home, &state, workspace.PackOptions{})
	require.NoError(t, err)

	exit := 0
	rec := &runindex.Record{UserID: user, ConversationID: "cli", TaskID: task, RunID: runID, SessionID: "default",
		Status: status, Start: start, End: start.Add(3 * time.Second), ExitCode: &exit, Runtime: "runc",
		Changes: &runindex.Changes{TreeHash: set.TreeHash, Summary: set.Summary}}
	ref := rec.Ref()
	put := func(name, body, ct string) string {
		info, err := st.PutRunFile(ctx, ref, name, strings.NewReader(body), ct)
		require.NoError(t, err)
		rec.Stored = append(rec.Stored, info)
		return info.Key
	}
	rec.Keys.Log = put("output.log", "hello from "+runID+"\n\x1b]0;pwned\x07", "text/plain")
	rec.Keys.Stderr = put("stderr.log", "warning\n", "text/plain")
	rec.Keys.Patch = put("changes.patch", patch.String(), "text/x-diff")
	rec.Keys.Changes = put("changes.json", string(setJSON), "application/json")
	rec.Keys.State = put("state.tar.gz", state.String(), "application/gzip")
	info, err := st.PutArtifact(ctx, ref, "report.md", strings.NewReader("# report\n"), "text/markdown")
	require.NoError(t, err)
	rec.Stored = append(rec.Stored, info)
	_, err = runindex.Put(ctx, st, rec)
	require.NoError(t, err)
	return storedRun{orig: orig, home: home, rec: rec}
}

func TestInspectionCommandsFile(t *testing.T) {
	inspectionCommands(t, "file://"+filepath.Join(t.TempDir(), "store"))
}

func TestInspectionCommandsS3(t *testing.T) {
	inspectionCommands(t, s3test.Start(t))
}

func inspectionCommands(t *testing.T, store string) {
	t0 := time.Date(2026, 6, 1, 9, 0, 0, 0, time.UTC)
	r1 := storeFakeRun(t, store, "alice", "fix", "run-1", t0, model.StatusSucceeded)
	storeFakeRun(t, store, "bob", "fix", "run-2", t0.Add(time.Minute), model.StatusFailed)
	storeFakeRun(t, store, "alice", "docs", "run-3", t0.Add(2*time.Minute), model.StatusSucceeded)

	out, stderr, code := taskrunCmd("runs", "--store", store)
	require.Equal(t, exitOK, code, stderr)
	assert.Regexp(t, `(?s)RUN +USER +TASK +STATUS.*run-3 +alice +docs +SUCCEEDED.*run-2 +bob +fix +FAILED.*run-1 +alice`, out)

	out, stderr, code = taskrunCmd("runs", "--store", store, "--user", "alice", "--status", "succeeded", "--task", "fix", "--json")
	require.Equal(t, exitOK, code, stderr)
	var recs []runindex.Record
	require.NoError(t, json.Unmarshal([]byte(out), &recs))
	require.Len(t, recs, 1)
	assert.Equal(t, "run-1", recs[0].RunID)
	assert.Equal(t, int64(3000), recs[0].DurationMS)

	_, stderr, code = taskrunCmd("runs", "--store", store, "--status", "bogus")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "SUCCEEDED")

	out, stderr, code = taskrunCmd("logs", "--store", store, "run-1")
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "hello from run-1\n\x1b]0;pwned\x07", out, "piped output is byte-exact")
	var tty lockedbuf.Buffer
	a := newApp(&tty, &lockedbuf.Buffer{})
	a.isTerminal = func(io.Writer) bool { return true }
	require.Equal(t, exitOK, a.run(context.Background(), []string{"logs", "--store", store, "run-1"}))
	assert.Equal(t, "hello from run-1\n^[]0;pwned^G", tty.String(), "a terminal sees escape sequences as text")
	out, _, code = taskrunCmd("logs", "--store", store, "--stderr", "run-1")
	require.Equal(t, exitOK, code)
	assert.Equal(t, "warning\n", out)

	out, stderr, code = taskrunCmd("diff", "--store", store, "run-1")
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, out, "diff --git a/main.go b/main.go")
	assert.Contains(t, out, "deleted file mode 100644")

	out, stderr, code = taskrunCmd("diff", "--store", store, "--json", "run-1")
	require.Equal(t, exitOK, code, stderr)
	var set changeset.Set
	require.NoError(t, json.Unmarshal([]byte(out), &set))
	assert.Equal(t, 3, set.Summary.Files)

	// apply turns a fresh copy of the original into the run's final home.
	fresh := t.TempDir()
	_, err := workspace.CopyTree(context.Background(), r1.orig, fresh, workspace.CopyOptions{})
	require.NoError(t, err)
	_, stderr, code = taskrunCmd("apply", "--store", store, "run-1", fresh)
	require.Equal(t, exitOK, code, stderr)
	got, err := os.ReadFile(filepath.Join(fresh, "main.go"))
	require.NoError(t, err)
	assert.Equal(t, "package main\n\n// done\n", string(got))
	assert.NoFileExists(t, filepath.Join(fresh, "old.txt"))
	info, err := os.Stat(filepath.Join(fresh, "new.sh"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), info.Mode().Perm()&0o755)

	dest := t.TempDir()
	out, stderr, code = taskrunCmd("cp", "--store", store, "--json", "run-1:home/main.go", dest)
	require.Equal(t, exitOK, code, stderr)
	var res cpResult
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	assert.Equal(t, filepath.Join(dest, "main.go"), res.Dest)
	assert.Equal(t, int64(len("package main\n\n// done\n")), res.Bytes)
	got, err = os.ReadFile(res.Dest)
	require.NoError(t, err)
	assert.Equal(t, "package main\n\n// done\n", string(got))
	out, stderr, code = taskrunCmd("cp", "--store", store, "run-1:artifacts/report.md", "-")
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "# report\n", out)
	_, stderr, code = taskrunCmd("cp", "--store", store, "run-1:home/old.txt", dest)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "not in run run-1's final home")
	_, stderr, code = taskrunCmd("cp", "--store", store, "run-1:../../x", dest)
	assert.Equal(t, exitUsage, code, stderr)

	out, stderr, code = taskrunCmd("inspect", "--store", store, "run-1")
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, out, "SUCCEEDED")
	assert.Contains(t, out, "3 files (1 added, 1 deleted, 1 modified")
	assert.Contains(t, out, "/runs/run-1/changes.patch")
	out, stderr, code = taskrunCmd("inspect", "--store", store, "--json", "run-1")
	require.Equal(t, exitOK, code, stderr)
	var rec runindex.Record
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	assert.Equal(t, r1.rec.Keys, rec.Keys)

	_, stderr, code = taskrunCmd("inspect", "--store", store, "no-such-run")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "taskrun runs")
}
