package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
)

// logs --follow prints a live run's output from the executor's spool as it
// is written and returns once the run has ended.
func TestLogsFollowsALiveRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real container")
	}
	root, store, user := t.TempDir(), "file://"+filepath.Join(t.TempDir(), "store"), tenant(t)
	runID := "follow-" + user
	done := make(chan int, 1)
	go func() {
		_, _, code := taskrunCmd("run", "--root", root, "--store", store, "--helpers-dir", "", "--gc=false",
			"--user", user, "--run-id", runID, "--image", testImage,
			"--", "sh", "-c", "echo one; sleep 2; echo two; sleep 1; printf three")
		done <- code
	}()
	require.Eventually(t, func() bool {
		out, _, code := taskrunCmd("runs", "--store", store, "--user", user, "--json")
		var recs []runindex.Record
		return code == exitOK && json.Unmarshal([]byte(out), &recs) == nil && len(recs) == 1 && recs[0].Status == model.StatusRunning
	}, time.Minute, 50*time.Millisecond, "the run shows as RUNNING")

	out, stderr, code := taskrunCmd("logs", "--follow", "--root", root, "--store", store, runID)
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "one\ntwo\nthree", out)
	assert.Equal(t, exitOK, <-done)

	// Once it has ended, --follow prints the stored log.
	out, stderr, code = taskrunCmd("logs", "--follow", "--root", root, "--store", store, runID)
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "one\ntwo\nthree", out)
}

// logs --follow with a --root other than the live run's says which flag to
// fix, rather than that the run has no log.
func TestLogsFollowWithTheWrongRootNamesIt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real container")
	}
	root, store, user := t.TempDir(), "file://"+filepath.Join(t.TempDir(), "store"), tenant(t)
	runID := "wrongroot-" + user
	done := make(chan int, 1)
	go func() {
		// The run waits for the test's go-ahead, a file in its home.
		_, _, code := taskrunCmd("run", "--root", root, "--store", store, "--helpers-dir", "", "--gc=false",
			"--user", user, "--run-id", runID, "--image", testImage,
			"--", "sh", "-c", "echo one; while [ ! -e go-ahead ]; do sleep 0.1; done; echo two")
		done <- code
	}()
	require.Eventually(t, func() bool {
		out, _, code := taskrunCmd("runs", "--store", store, "--user", user, "--json")
		var recs []runindex.Record
		return code == exitOK && json.Unmarshal([]byte(out), &recs) == nil && len(recs) == 1 && recs[0].Status == model.StatusRunning
	}, time.Minute, 50*time.Millisecond, "the run shows as RUNNING")

	other := t.TempDir()
	_, stderr, code := taskrunCmd("logs", "--follow", "--root", other, "--store", store, runID)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "is in progress on this host, but not under --root "+other+": give the --root it was started with")

	home := taskrun.NewRuntimePathsFromRoot(root).RuntimeTaskRunHomeDir(user, defaultConversation, defaultTask, runID)
	require.NoError(t, os.WriteFile(filepath.Join(home, "go-ahead"), nil, 0o644))
	require.Equal(t, exitOK, <-done)
	out, stderr, code := taskrunCmd("logs", "--follow", "--root", other, "--store", store, runID)
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "one\ntwo\n", out, "an ended run's stored log is printed whatever the root")
}
