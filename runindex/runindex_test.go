package runindex_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/persist/s3test"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/workspace"
)

func open(t *testing.T, rawURL string) *persist.Store {
	t.Helper()
	s, err := persist.Open(context.Background(), rawURL)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

func TestFile(t *testing.T) {
	exercise(t, open(t, "file://"+filepath.Join(t.TempDir(), "store")))
}

func TestS3(t *testing.T) {
	exercise(t, open(t, s3test.Start(t)))
}

// storeRun stores a run's objects and its record, as the executor does.
func storeRun(t *testing.T, s *persist.Store, rec *runindex.Record, home string) {
	t.Helper()
	ctx := context.Background()
	ref := rec.Ref()
	put := func(name, body string) string {
		info, err := s.PutRunFile(ctx, ref, name, strings.NewReader(body), "text/plain")
		require.NoError(t, err)
		rec.Stored = append(rec.Stored, info)
		return info.Key
	}
	rec.Keys.Log = put("output.log", "stdout of "+rec.RunID+"\n")
	rec.Keys.Stderr = put("stderr.log", "stderr of "+rec.RunID+"\n")
	rec.Keys.Patch = put("changes.patch", "diff --git a/x b/x\n")
	put("output/result.md", "# result\n")
	info, err := s.PutArtifact(ctx, ref, "report/summary.txt", strings.NewReader("artifact body"), "text/plain")
	require.NoError(t, err)
	rec.Stored = append(rec.Stored, info)
	if home != "" {
		var state bytes.Buffer
		_, err := workspace.PackHome(ctx, home, &state, workspace.PackOptions{})
		require.NoError(t, err)
		rec.Keys.State = put("state.tar.gz", state.String())
	}
	_, err = runindex.Put(ctx, s, rec)
	require.NoError(t, err)
}

func exercise(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	t0 := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	home := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(home, "src"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(home, "src", "main.go"), []byte("package main\n"), 0o644))
	require.NoError(t, os.Symlink("src/main.go", filepath.Join(home, "link")))

	mk := func(user, task, run string, status model.RunStatus, start time.Time) *runindex.Record {
		exit := 0
		return &runindex.Record{UserID: user, ConversationID: "cli", TaskID: task, RunID: run, Status: status,
			Start: start, End: start.Add(90 * time.Second), ExitCode: &exit}
	}
	a1 := mk("alice", "t1", "run-a1", model.StatusSucceeded, t0)
	a2 := mk("alice", "t2", "run-a2", model.StatusFailed, t0.Add(time.Hour))
	b1 := mk("bob", "t1", "run-b1", model.StatusSucceeded, t0.Add(30*time.Minute))
	shared := mk("bob", "t9", "run-a1", model.StatusSucceeded, t0.Add(2*time.Hour))
	storeRun(t, s, a1, home)
	storeRun(t, s, a2, "")
	storeRun(t, s, b1, "")

	ids := func(recs []runindex.Record) []string {
		var out []string
		for _, r := range recs {
			out = append(out, r.UserID+"/"+r.RunID)
		}
		return out
	}
	all, err := runindex.List(ctx, s, runindex.Filter{})
	require.NoError(t, err)
	assert.Equal(t, []string{"alice/run-a2", "bob/run-b1", "alice/run-a1"}, ids(all))
	assert.Equal(t, int64(90_000), all[0].DurationMS)

	got, err := runindex.List(ctx, s, runindex.Filter{UserID: "alice"})
	require.NoError(t, err)
	assert.Equal(t, []string{"alice/run-a2", "alice/run-a1"}, ids(got))
	got, err = runindex.List(ctx, s, runindex.Filter{TaskID: "t1"})
	require.NoError(t, err)
	assert.Equal(t, []string{"bob/run-b1", "alice/run-a1"}, ids(got))
	got, err = runindex.List(ctx, s, runindex.Filter{Status: "failed"})
	require.NoError(t, err)
	assert.Equal(t, []string{"alice/run-a2"}, ids(got))
	got, err = runindex.List(ctx, s, runindex.Filter{Limit: 1})
	require.NoError(t, err)
	assert.Equal(t, []string{"alice/run-a2"}, ids(got))
	_, err = runindex.List(ctx, s, runindex.Filter{UserID: "../etc"})
	require.Error(t, err)

	rec, err := runindex.Find(ctx, s, "run-a1", "")
	require.NoError(t, err)
	assert.Equal(t, "alice", rec.UserID)
	_, err = runindex.Find(ctx, s, "nope", "")
	assert.ErrorIs(t, err, runindex.ErrNotFound)

	read := func(rc io.ReadCloser, err error) string {
		t.Helper()
		require.NoError(t, err)
		defer rc.Close()
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		return string(b)
	}
	assert.Equal(t, "stdout of run-a1\n", read(runindex.OpenLog(ctx, s, rec, false)))
	assert.Equal(t, "stderr of run-a1\n", read(runindex.OpenLog(ctx, s, rec, true)))
	assert.Equal(t, "diff --git a/x b/x\n", read(runindex.OpenPatch(ctx, s, rec)))
	assert.Equal(t, "artifact body", read(runindex.OpenFile(ctx, s, rec, "artifacts/report/summary.txt")))
	assert.Equal(t, "# result\n", read(runindex.OpenFile(ctx, s, rec, "output/result.md")))
	assert.Equal(t, "package main\n", read(runindex.OpenFile(ctx, s, rec, "home/src/main.go")))

	_, err = runindex.OpenFile(ctx, s, rec, "home/link")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "symlink")
	_, err = runindex.OpenFile(ctx, s, rec, "home/missing")
	assert.ErrorIs(t, err, persist.ErrNotFound)
	_, err = runindex.OpenFile(ctx, s, rec, "../../other/run/output.log")
	assert.ErrorIs(t, err, persist.ErrInvalidName)
	_, err = runindex.OpenFile(ctx, s, rec, "artifacts/none")
	assert.ErrorIs(t, err, persist.ErrNotFound)
	_, err = runindex.OpenFile(ctx, s, a2, "home/src/main.go")
	assert.ErrorIs(t, err, runindex.ErrNoObject, "a run without session state has no home files")

	// A record naming another tenant's object is not followed.
	forged := *a2
	forged.Keys.Log = b1.Keys.Log
	_, err = runindex.OpenLog(ctx, s, &forged, false)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "outside its tenant")

	// The same run ID under two tenants needs --user.
	storeRun(t, s, shared, "")
	_, err = runindex.Find(ctx, s, "run-a1", "")
	assert.ErrorIs(t, err, runindex.ErrAmbiguous)
	rec, err = runindex.Find(ctx, s, "run-a1", "bob")
	require.NoError(t, err)
	assert.Equal(t, "t9", rec.TaskID)
}
