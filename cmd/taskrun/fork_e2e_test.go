package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
)

// taskrun fork forks a live run, which keeps running, and then the same
// run paused: each fork is a live run of its own whose record names its
// parent and stops as any live run. Another uid finds no run to fork.
func TestDaemonForksALiveAndAPausedRun(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	runID := "fork" + strings.ToLower(tenant(t)[:8])
	_, stderr, code := d.runClient(t, 0, "--detach", "--user", e.user, "--run-id", runID, "--image", testImage)
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d.log)
	assert.Equal(t, "404", asNobody(t, d.sock, "POST", "/v1/runs/"+runID+"/fork", `{"n":1}`))

	out, stderr, code := runTaskrun(t, d, "fork", runID, "-n", "2")
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d.log)
	forks := strings.Fields(out)
	require.Len(t, forks, 2)

	// The parent is still live: it pauses, and forks again from its checkpoint.
	out, stderr, code = runTaskrun(t, d, "pause", runID)
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d.log)
	assert.Contains(t, out, "run "+runID+" PAUSED")
	out, stderr, code = runTaskrun(t, d, "fork", runID, "-n", "2", "--prompt", "another way")
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d.log)
	paused := strings.Fields(out)
	require.Len(t, paused, 2)
	forks = append(forks, paused...)

	for _, id := range forks {
		_, stderr, code = runTaskrun(t, d, "stop", id)
		require.Equal(t, exitOK, code, stderr)
	}
	for _, id := range forks {
		var status model.RunStatus
		require.Eventually(t, func() bool {
			rec := e.endedRecord(t, id)
			status = rec.Status
			return rec.Status == model.StatusCancelled && rec.ParentRunID == runID
		}, testdeadline.Scale(time.Minute), 200*time.Millisecond, "fork %s ends CANCELLED once stopped, naming its parent (%s)", id, status)
	}
	// The forks share the runs root: each is checked once all are released,
	// so that one's mounts are not taken for another's.
	for _, id := range forks {
		e.awaitJournalEnd(t, id)
	}
	for _, id := range forks {
		e.requireNothingLeft(t, id)
	}
	assert.Equal(t, model.StatusPaused, e.endedRecord(t, runID).Status, "forking a paused run leaves it paused")
}

// taskrun fork asks for one run and 1 to daemon.MaxForks forks before it
// dials the daemon.
func TestForkChecksItsArguments(t *testing.T) {
	for _, args := range [][]string{{"fork"}, {"fork", "r1", "-n", "0"}, {"fork", "r1", "-n", "17"}, {"fork", "r1", "r2"}} {
		_, stderr, code := taskrunCmd(args...)
		assert.Equal(t, exitUsage, code, "%q: %s", args, stderr)
	}
}
