package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/runindex"
)

// as is `taskrun ARGS` against the daemon at d's socket, as uid (0: the
// test's own), from /: stdout, stderr and exit status.
func (d *daemonProc) as(t *testing.T, uid uint32, args ...string) (string, string, int) {
	t.Helper()
	bin := taskrunBin(t)
	require.NoError(t, os.Chmod(filepath.Dir(bin), 0o755))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), daemon.EnvSocket+"="+d.sock)
	cmd.Dir = "/"
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	}
	var stdout, stderr lockedbuf.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return stdout.String(), stderr.String(), exitErr.ExitCode()
	}
	require.NoError(t, err)
	return stdout.String(), stderr.String(), 0
}

// runIDs of a `taskrun runs --json` listing.
func runIDs(t *testing.T, out string) []string {
	t.Helper()
	var recs []runindex.Record
	require.NoError(t, json.Unmarshal([]byte(out), &recs), out)
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.RunID)
	}
	return ids
}

// A client of uid 65534 reads its runs through the daemon (whose store it
// cannot open itself) with the output and exit status of the same reads in
// process; another tenant's runs are not found, and --user cannot widen it.
func TestDaemonReadsAreTheTenantsOwn(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	tenantName, err := daemon.UserNameTenant(nobody)
	require.NoError(t, err)
	sfx := strings.ToLower(tenant(t)[:8])
	mine, theirs := "mine"+sfx, "theirs"+sfx

	_, stderr, code := d.runClient(t, nobody, "--run-id", mine, "--image", testImage, "--",
		"sh", "-c", "echo out; echo err >&2; echo kept > new.txt; exit 3")
	require.Equal(t, 3, code, stderr)
	_, stderr, code = d.runClient(t, 0, "--user", e.user, "--run-id", theirs, "--image", testImage, "--", "sh", "-c", "echo secret > s.txt; echo secret")
	require.Equal(t, 0, code, stderr)

	// The same output and exit status as in process, reading the store.
	for _, args := range [][]string{
		{"inspect", mine}, {"inspect", "--json", mine}, {"logs", mine}, {"logs", "--stderr", mine}, {"logs", "--follow", mine},
		{"cp", mine + ":home/new.txt", "-"}, {"diff", mine}, {"diff", "--json", mine},
		{"runs", "--json"}, {"runs", "--status", "failed"},
		{"inspect", "nosuchrun"}, {"cp", mine + ":home/none.txt", "-"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			viaOut, viaErr, viaCode := d.as(t, nobody, args...)
			local := append([]string{args[0], "--local", "--store", e.store, "--user", tenantName}, args[1:]...)
			out, lerr, lcode := d.as(t, 0, local...)
			assert.Equal(t, lcode, viaCode, "daemon: %s\nlocal: %s", viaErr, lerr)
			assert.Equal(t, out, viaOut)
			assert.Equal(t, strings.ReplaceAll(lerr, "any user's", "user "+tenantName+"'s"), viaErr)
		})
	}
	out, stderr, code := d.as(t, nobody, "logs", mine)
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "out\n", out, "the client read its run's log through the daemon")

	// Another tenant's run is invisible.
	out, stderr, code = d.as(t, nobody, "runs", "--json")
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, []string{mine}, runIDs(t, out))
	for _, args := range [][]string{
		{"inspect", theirs}, {"logs", theirs}, {"logs", "--follow", theirs}, {"cp", theirs + ":home/s.txt", "-"},
		{"diff", theirs}, {"exec", theirs, "--", "cat", "s.txt"},
	} {
		t.Run("theirs "+args[0], func(t *testing.T) {
			out, stderr, code := d.as(t, nobody, args...)
			assert.Equal(t, exitUsage, code, stderr)
			assert.Contains(t, stderr, "not found")
			assert.NotContains(t, out+stderr, "secret")
		})
	}
	for _, args := range [][]string{{"inspect", "--user", e.user, theirs}, {"runs", "--user", e.user}, {"logs", "--user", e.user, theirs}} {
		out, stderr, code := d.as(t, nobody, args...)
		assert.Equal(t, exitUsage, code, "%v: %s", args, stderr)
		assert.Contains(t, stderr, `reads the runs of tenant "`+tenantName+`" only`)
		assert.NotContains(t, out, "secret")
	}
	// Root reads every tenant's.
	out, stderr, code = d.as(t, 0, "logs", theirs)
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "secret\n", out)
	out, stderr, code = d.as(t, 0, "runs", "--json")
	require.Equal(t, exitOK, code, stderr)
	assert.ElementsMatch(t, []string{mine, theirs}, runIDs(t, out))
}

// taskrun exec reaches a client's own run in progress on the daemon, with
// the command's output and exit status, and never another tenant's.
func TestDaemonExecIsTheTenantsOwn(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	sfx := strings.ToLower(tenant(t)[:8])
	mine, theirs := "xmine"+sfx, "xtheirs"+sfx
	_, stderr, code := d.runClient(t, nobody, "--detach", "--run-id", mine, "--image", testImage)
	require.Equal(t, exitOK, code, stderr)
	_, stderr, code = d.runClient(t, 0, "--detach", "--user", e.user, "--run-id", theirs, "--image", testImage)
	require.Equal(t, exitOK, code, stderr)
	t.Cleanup(func() {
		for _, id := range []string{mine, theirs} {
			_, _, _ = d.as(t, 0, "stop", id)
		}
		for _, id := range []string{mine, theirs} {
			e.endedRecord(t, id)
		}
		for _, id := range []string{mine, theirs} {
			e.requireNothingLeft(t, id)
		}
	})

	out, stderr, code := d.as(t, nobody, "exec", mine, "--", "sh", "-c", "echo hi; echo oops >&2; exit 4")
	assert.Equal(t, 4, code, stderr)
	assert.Equal(t, "hi\n", out)
	assert.Equal(t, "oops\n", stderr)

	out, stderr, code = d.as(t, nobody, "exec", theirs, "--", "sh", "-c", "touch /tmp/pwned; echo ran")
	assert.Equal(t, exitUsage, code, stderr)
	assert.NotContains(t, out, "ran")
	out, stderr, code = d.as(t, 0, "exec", theirs, "--", "sh", "-c", "test ! -e /tmp/pwned && echo clean")
	assert.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "clean\n", out, "another tenant's command ran in the run")

	// A run that is over: the in-process message and status.
	_, stderr, code = d.as(t, nobody, "stop", mine)
	require.Equal(t, exitOK, code, stderr)
	e.endedRecord(t, mine)
	_, stderr, code = d.as(t, nobody, "exec", mine, "--", "true")
	assert.Equal(t, exitUsage, code, stderr)
	assert.Contains(t, stderr, "is CANCELLED, not in progress")
	// Its record holds the command, read through the daemon.
	out, stderr, code = d.as(t, nobody, "inspect", "--json", mine)
	require.Equal(t, exitOK, code, stderr)
	var rec runindex.Record
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	require.Len(t, rec.Execs, 1)
	assert.Equal(t, 4, rec.Execs[0].Exit)
}

// taskrun logs --follow through the daemon follows a client's run in
// progress there from the daemon's spool to the run's end.
func TestDaemonLogsFollowsARunInProgress(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	runID := "follow" + strings.ToLower(tenant(t)[:8])
	client := d.client(t, nobody, "--run-id", runID, "--image", testImage, "--", "sh", "-c", "echo first; sleep 3; echo second")
	require.NoError(t, client.Start())
	done := make(chan error, 1)
	go func() { done <- client.Wait() }()
	require.Eventually(t, func() bool {
		out, _, code := d.as(t, nobody, "inspect", "--json", runID)
		var rec runindex.Record
		return code == exitOK && json.Unmarshal([]byte(out), &rec) == nil && rec.Status == "RUNNING"
	}, testdeadline.Scale(time.Minute), 50*time.Millisecond)
	out, stderr, code := d.as(t, nobody, "logs", "--follow", runID)
	assert.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "first\nsecond\n", out)
	require.NoError(t, <-done)
	// Another tenant cannot follow it.
	_, stderr, code = d.as(t, nobody, "logs", "--follow", "--user", e.user, runID)
	assert.Equal(t, exitUsage, code, stderr)
}
