package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/model"
)

// A run paused through one daemon survives it: the daemon is killed, and
// another daemon with another runs root and the same store resumes it,
// from its index record and its stored request. Another tenant finds it
// on neither; an archive changed in the store is refused and the run
// stays PAUSED; once resumed it cannot be resumed again.
func TestDaemonResumesARunPausedByAnotherDaemon(t *testing.T) {
	e := newCrashEnv(t)
	d1 := startLiveDaemon(t, e)
	runID := d1.detach(t, e, "prst")
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
	d2 := startLiveDaemon(t, &e2)
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
	e.stopLive(t, d2, runID)
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
