package main

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
)

// refusedStatus is the HTTP status of a refusal of the daemon, 0 if err
// is none.
func refusedStatus(t *testing.T, err error) int {
	t.Helper()
	var re *daemon.RefusedError
	require.ErrorAs(t, err, &re)
	return re.Status
}

// A live run's commands get process IDs: a background command takes
// stdin, signals of the allow-list (to it alone), and a reader that comes
// back later reattaches to its output from an offset; the run lists them
// and records each; another tenant finds none of them, and an unknown
// process is not found.
func TestDaemonLiveRunProcesses(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	runID := "proc" + strings.ToLower(tenant(t)[:8])
	otherID := "othr" + strings.ToLower(tenant(t)[:8])
	for _, id := range []string{runID, otherID} {
		_, stderr, code := d.runClient(t, 0, "--detach", "--user", e.user, "--run-id", id, "--image", testImage)
		require.Equal(t, exitOK, code, "%s\n%s", stderr, d.log)
	}
	ctx := context.Background()
	c, err := daemon.Dial(ctx, d.sock)
	require.NoError(t, err)
	defer c.Close()

	// Stdin, in bounded writes, to its end.
	cat, err := c.StartProcess(ctx, runID, daemon.ExecRequest{Argv: []string{"sh", "-c", `while read l; do echo "got $l"; done; echo eof >&2`}, Stdin: true})
	require.NoError(t, err, d.log.String())
	require.NoError(t, c.WriteStdin(ctx, runID, cat.ID, []byte("a\n"), false))
	require.NoError(t, c.WriteStdin(ctx, runID, cat.ID, []byte("b\n"), true))
	var out, errOut lockedbuf.Buffer
	res, _, err := c.Output(ctx, runID, cat.ID, 0, true, &out, &errOut)
	require.NoError(t, err)
	assert.Equal(t, 0, res.Exit, res.Error)
	assert.Equal(t, "got a\ngot b\n", out.String())
	assert.Equal(t, "eof\n", errOut.String())
	assert.Equal(t, http.StatusConflict, refusedStatus(t, c.WriteStdin(ctx, runID, cat.ID, []byte("late\n"), false)), "stdin to an ended command")
	assert.Equal(t, http.StatusRequestEntityTooLarge, refusedStatus(t, c.WriteStdin(ctx, runID, cat.ID, make([]byte, daemon.MaxStdinBytes+1), false)))

	// A signal of the allow-list reaches the command; one off it is refused.
	trap, err := c.StartProcess(ctx, runID, daemon.ExecRequest{Argv: []string{"sh", "-c", `trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.1; done`}})
	require.NoError(t, err)
	var trapOut lockedbuf.Buffer
	var off int64
	require.Eventually(t, func() bool {
		_, off, err = c.Output(ctx, runID, trap.ID, off, false, &trapOut, &trapOut)
		return err == nil && trapOut.String() == "ready\n"
	}, testdeadline.Scale(30*time.Second), 50*time.Millisecond)
	assert.Equal(t, http.StatusBadRequest, refusedStatus(t, c.Signal(ctx, runID, trap.ID, "SEGV")))
	// Not through another run, even the same tenant's: process IDs are
	// the run's own.
	assert.Equal(t, http.StatusNotFound, refusedStatus(t, c.Signal(ctx, otherID, trap.ID, "KILL")))
	info, err := c.Process(ctx, runID, trap.ID)
	require.NoError(t, err)
	assert.True(t, info.Running, "a signal through another run reached the command")
	require.NoError(t, c.Signal(ctx, runID, trap.ID, "SIGTERM"))
	res, _, err = c.Output(ctx, runID, trap.ID, off, true, &trapOut, &trapOut)
	require.NoError(t, err)
	assert.Equal(t, 7, res.Exit)
	assert.Equal(t, "ready\nterm\n", trapOut.String())
	assert.Equal(t, http.StatusConflict, refusedStatus(t, c.Signal(ctx, runID, trap.ID, "TERM")), "a signal to an ended command")

	// Reattach: a reader that comes back later reads from its offset.
	count, err := c.StartProcess(ctx, runID, daemon.ExecRequest{Argv: []string{"sh", "-c", `for i in 1 2 3; do echo $i; sleep 0.2; done`}})
	require.NoError(t, err)
	var tail lockedbuf.Buffer
	res, _, err = c.Output(ctx, runID, count.ID, 2, true, &tail, &tail)
	require.NoError(t, err)
	assert.Equal(t, 0, res.Exit)
	assert.Equal(t, "2\n3\n", tail.String())

	// A PTY.
	var ttyOut lockedbuf.Buffer
	tty, err := c.StartProcess(ctx, runID, daemon.ExecRequest{Argv: []string{"tty"}, Tty: true})
	require.NoError(t, err)
	res, _, err = c.Output(ctx, runID, tty.ID, 0, true, &ttyOut, &ttyOut)
	require.NoError(t, err)
	assert.Equal(t, 0, res.Exit, ttyOut.String())
	assert.Contains(t, ttyOut.String(), "/dev/pts/")

	// A foreground command names its process: a signal from another call
	// ends it.
	fg := make(chan *daemon.ExecResult, 1)
	go func() {
		res, _ := c.Exec(ctx, runID, daemon.ExecRequest{Argv: []string{"sleep", "300"}}, &lockedbuf.Buffer{}, &lockedbuf.Buffer{})
		fg <- res
	}()
	var sleepID string
	require.Eventually(t, func() bool {
		list, err := c.Processes(ctx, runID)
		if err != nil || len(list) != 5 || !list[4].Running {
			return false
		}
		sleepID = list[4].ID
		return true
	}, testdeadline.Scale(30*time.Second), 50*time.Millisecond)
	require.NoError(t, c.Signal(ctx, runID, sleepID, "KILL"))
	select {
	case res := <-fg:
		require.NotNil(t, res)
		assert.Equal(t, 137, res.Exit)
	case <-time.After(testdeadline.Scale(30 * time.Second)):
		t.Fatal("a killed command's stream did not end")
	}

	list, err := c.Processes(ctx, runID)
	require.NoError(t, err)
	require.Len(t, list, 5)
	for i, p := range list {
		assert.False(t, p.Running, "process %s", p.ID)
		assert.NotNil(t, p.Result, "process %s", p.ID)
		if i > 0 {
			assert.NotEqual(t, list[i-1].ID, p.ID)
		}
	}
	assert.Equal(t, []string{"tty"}, list[3].Argv)

	// An unknown process is not found; another tenant finds nothing.
	_, err = c.Process(ctx, runID, "p999")
	assert.Equal(t, http.StatusNotFound, refusedStatus(t, err))
	assert.Contains(t, err.Error(), `no process "p999"`)
	base := "/v1/runs/" + runID + "/processes"
	for _, call := range [][3]string{
		{"GET", base, ""},
		{"POST", base, `{"argv":["touch","/tmp/pwned"]}`},
		{"GET", base + "/" + trap.ID, ""},
		{"GET", base + "/" + trap.ID + "/output", ""},
		{"POST", base + "/" + cat.ID + "/stdin", "x"},
		{"POST", base + "/" + trap.ID + "/signal", `{"signal":"KILL"}`},
	} {
		assert.Equal(t, "404", asNobody(t, d.sock, call[0], call[1], call[2]), "%s %s", call[0], call[1])
	}

	for _, id := range []string{runID, otherID} {
		_, stderr, code := runTaskrun(t, d, "stop", id)
		require.Equal(t, exitOK, code, stderr)
	}
	rec := e.endedRecord(t, runID)
	assert.Equal(t, model.StatusCancelled, rec.Status)
	require.Len(t, rec.Execs, 5, "every command is in the run's record")
	assert.Equal(t, 7, rec.Execs[1].Exit)
	// Both runs have ended before the host is checked: the check looks at
	// every mount under the runs root, the other run's too.
	e.endedRecord(t, otherID)
	e.requireNothingLeft(t, runID)
	e.requireNothingLeft(t, otherID)
}
