package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
)

// A run paused through one daemon survives it: the daemon is killed, and
// another daemon with another runs root and the same store resumes it,
// from its index record and its stored request. Another tenant finds it
// on neither; an archive changed in the store is refused and the run
// stays PAUSED; once resumed it cannot be resumed again.
func TestDaemonResumesARunPausedByAnotherDaemon(t *testing.T) {
	e := newCrashEnv(t)
	d1 := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	runID := "prst" + strings.ToLower(tenant(t)[:8])
	_, stderr, code := d1.runClient(t, 0, "--detach", "--user", e.user, "--run-id", runID, "--image", testImage)
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d1.log)
	assert.Equal(t, "404", asNobody(t, d1.sock, "POST", "/v1/runs/"+runID+"/pause", ""))
	out, stderr, code := runTaskrun(t, d1, "pause", runID)
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d1.log)
	assert.Contains(t, out, "run "+runID+" PAUSED")
	rec := e.endedRecord(t, runID)
	require.Equal(t, model.StatusPaused, rec.Status)
	require.NotNil(t, rec.Checkpoint, "the index record names the checkpoint")
	require.NoError(t, d1.cmd.Process.Kill())
	e.requireNothingLeft(t, runID)

	e2 := *e
	e2.root = t.TempDir()
	d2 := startDaemon(t, &e2, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	assert.Equal(t, "404", asNobody(t, d2.sock, "POST", "/v1/runs/"+runID+"/resume", ""), "another tenant does not find the run")

	// A changed archive is refused, and the run stays PAUSED.
	archive := storedObject(t, e, runID, checkpoint.ArchiveObject)
	orig, err := os.ReadFile(archive)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(archive, append([]byte("x"), orig...), 0o600))
	_, stderr, code = runTaskrun(t, d2, "resume", runID)
	assert.NotEqual(t, exitOK, code)
	assert.Contains(t, stderr, "stays PAUSED")
	assert.Equal(t, model.StatusPaused, e.endedRecord(t, runID).Status)
	require.NoError(t, os.WriteFile(archive, orig, 0o600))

	out, stderr, code = runTaskrun(t, d2, "resume", runID)
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d2.log)
	assert.Equal(t, runID, strings.TrimSpace(out))
	_, stderr, code = runTaskrun(t, d2, "stop", runID)
	require.Equal(t, exitOK, code, stderr)
	require.Eventually(t, func() bool {
		rec = e.endedRecord(t, runID)
		return rec.Status == model.StatusCancelled
	}, testdeadline.Scale(time.Minute), 200*time.Millisecond, "the resumed run ends CANCELLED once stopped")
	e.requireNothingLeft(t, runID)

	_, stderr, code = runTaskrun(t, d2, "resume", runID)
	assert.NotEqual(t, exitOK, code)
	assert.Contains(t, stderr, "not PAUSED")
}

// storedObject is the path in e's file:// store of runID's object name
// (not its digest's record).
func storedObject(t *testing.T, e *crashEnv, runID, name string) string {
	t.Helper()
	var found string
	root := strings.TrimPrefix(e.store, "file://")
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, "/"+name) && strings.Contains(p, "/"+runID+"/") && !strings.Contains(p, "/digests/") {
			found = p
		}
		return err
	}))
	require.NotEmpty(t, found, "no object %s of run %s in the store", name, runID)
	return found
}
