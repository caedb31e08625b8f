package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"golang.org/x/sys/unix"

	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
)

// exec runs a command in a live run's container as the run's own user, with
// no capability and no-new-privileges, returns its exit status and adds it
// to the run's record.
func TestExecRunsUnderTheRunsPolicyAndIsRecorded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real container")
	}
	root, store, user := t.TempDir(), "file://"+filepath.Join(t.TempDir(), "store"), tenant(t)
	runID := "exec-" + user
	done := make(chan int, 1)
	go func() {
		_, _, code := taskrunCmd("run", "--root", root, "--store", store, "--helpers-dir", "", "--gc=false",
			"--user", user, "--run-id", runID, "--image", testImage,
			"--", "sh", "-c", "id -u > /tmp/agent-uid; while [ ! -e $HOME/stop ]; do sleep 0.2; done")
		done <- code
	}()
	require.Eventually(t, func() bool {
		out, _, code := taskrunCmd("runs", "--store", store, "--user", user, "--json")
		var recs []runindex.Record
		return code == exitOK && json.Unmarshal([]byte(out), &recs) == nil && len(recs) == 1 && recs[0].Status == model.StatusRunning
	}, time.Minute, 50*time.Millisecond)

	out, stderr, code := taskrunCmd("exec", "--store", store, runID, "--", "sh", "-c",
		`echo "uid $(id -u) agent $(cat /tmp/agent-uid)"; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status; printf '\033]0;title\007'`)
	require.Equal(t, exitOK, code, stderr)
	fields := strings.Fields(strings.SplitN(out, "\n", 2)[0])
	require.Len(t, fields, 4, out)
	assert.Equal(t, fields[1], fields[3], "the command runs as the agent's uid")
	assert.NotEqual(t, "0", fields[1])
	assert.Regexp(t, `CapPrm:\s+0000000000000000`, out)
	assert.Regexp(t, `CapEff:\s+0000000000000000`, out)
	assert.Regexp(t, `NoNewPrivs:\s+1`, out)

	_, _, code = taskrunCmd("exec", "--store", store, runID, "--", "sh", "-c", "exit 3")
	assert.Equal(t, 3, code, "exec exits with the command's status")

	// On a terminal the command gets a PTY, and its escape sequences reach
	// the terminal as text.
	master, slave := openPTY(t, 33, 101)
	var tty lockedbuf.Buffer
	go func() { _, _ = io.Copy(&tty, master) }()
	stdinFile = slave
	t.Cleanup(func() { stdinFile = os.Stdin })
	var ttyErr lockedbuf.Buffer
	a := newApp(slave, &ttyErr)
	code = a.run(context.Background(), []string{"exec", "--store", store, runID, "--", "sh", "-c", `tty; printf '\033]0;pwned\007'`})
	require.Equal(t, exitOK, code, ttyErr.String())
	require.Eventually(t, func() bool { return strings.Contains(tty.String(), "^[]0;pwned^G") }, testdeadline.Scale(10*time.Second), 10*time.Millisecond, tty.String())
	assert.Contains(t, tty.String(), "/dev/pts/")
	assert.NotContains(t, tty.String(), "\x1b]0;pwned")

	_, stderr, code = taskrunCmd("exec", "--store", store, runID, "--", "touch", "/taskrun/home/stop")
	require.Equal(t, exitOK, code, stderr)
	require.Equal(t, exitOK, <-done)

	out, stderr, code = taskrunCmd("inspect", "--store", store, "--json", runID)
	require.Equal(t, exitOK, code, stderr)
	var rec runindex.Record
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	require.Len(t, rec.Execs, 4)
	assert.Equal(t, []string{"sh", "-c", "exit 3"}, rec.Execs[1].Command)
	assert.Equal(t, 3, rec.Execs[1].Exit)
	assert.NotEmpty(t, rec.Execs[0].By)

	_, stderr, code = taskrunCmd("exec", "--store", store, runID, "--", "true")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "not in progress")
}

// openPTY opens a pseudo-terminal of rows x cols and returns its master and
// slave ends, closed when the test ends.
func openPTY(t *testing.T, rows, cols uint16) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { master.Close() })
	require.NoError(t, unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	require.NoError(t, err)
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { slave.Close() })
	require.NoError(t, unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}))
	return master, slave
}
