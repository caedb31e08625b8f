package main

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
)

// endedRecord is the stored record of runID, once the run has ended.
func (e *crashEnv) endedRecord(t *testing.T, runID string) runindex.Record {
	t.Helper()
	var rec runindex.Record
	require.Eventually(t, func() bool {
		out, err := e.command(t, nil, "inspect", "--store", e.store, "--json", runID).Output()
		return err == nil && json.Unmarshal(out, &rec) == nil && rec.Status != model.StatusRunning && rec.Status != ""
	}, testdeadline.Scale(time.Minute), 100*time.Millisecond, "run %s never ended", runID)
	return rec
}

// startLiveDaemon starts a daemon on e's root and store, with extra
// flags, at a socket of its own.
func startLiveDaemon(t *testing.T, e *crashEnv, extra ...string) *daemonProc {
	t.Helper()
	return startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"), extra...)
}

// detach starts a live run of e's user through d (taskrun run --detach)
// and returns its ID: prefix and the test's tenant.
func (d *daemonProc) detach(t *testing.T, e *crashEnv, prefix string) string {
	t.Helper()
	runID := prefix + strings.ToLower(tenant(t)[:8])
	out, stderr, code := d.runClient(t, 0, "--detach", "--user", e.user, "--run-id", runID, "--image", testImage)
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d.log)
	assert.Equal(t, runID, strings.TrimSpace(out), "detach prints the run's ID")
	return runID
}

// dialDaemon is a client of d's API, closed at cleanup.
func dialDaemon(t *testing.T, d *daemonProc) *daemon.Client {
	t.Helper()
	c, err := daemon.Dial(context.Background(), d.sock)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// stopLive stops the live run runID through d (taskrun stop) and returns
// its record once it ended CANCELLED.
func (e *crashEnv) stopLive(t *testing.T, d *daemonProc, runID string) runindex.Record {
	t.Helper()
	_, stderr, code := runTaskrun(t, d, "stop", runID)
	require.Equal(t, exitOK, code, stderr)
	var rec runindex.Record
	require.Eventually(t, func() bool {
		rec = e.endedRecord(t, runID)
		return rec.Status == model.StatusCancelled
	}, testdeadline.Scale(time.Minute), 200*time.Millisecond, "run %s never ended CANCELLED once stopped", runID)
	return rec
}

// asNobody is curl against the daemon at sock as uid nobody: the HTTP status.
func asNobody(t *testing.T, sock, method, path, body string) string {
	t.Helper()
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl: another uid's calls are not tried")
	}
	c := exec.Command(curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", sock, "-X", method, "-d", body, "http://taskrun"+path)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	code, err := c.Output()
	require.NoError(t, err)
	return string(code)
}

// A live run takes 50 commands through the daemon, as the run's own user
// under its policy, each recorded; another tenant finds none of it; stop
// ends the run and stores it.
func TestDaemonLiveRunServesCommands(t *testing.T) {
	e := newCrashEnv(t)
	d := startLiveDaemon(t, e)
	runID := d.detach(t, e, "live")
	ctx := context.Background()
	c := dialDaemon(t, d)
	const n = 50
	start := time.Now()
	for i := 0; i < n; i++ {
		var stdout, stderr lockedbuf.Buffer
		res, err := c.Exec(ctx, runID, daemon.ExecRequest{
			Argv: []string{"sh", "-c", `echo "$N $(pwd)"; echo e$N >&2; exit $((N % 3))`},
			Env:  []string{fmt.Sprintf("N=%d", i)}, Cwd: "/tmp",
		}, &stdout, &stderr)
		require.NoError(t, err, "command %d", i)
		require.Empty(t, res.Error)
		assert.Equal(t, i%3, res.Exit)
		assert.Equal(t, fmt.Sprintf("%d /tmp\n", i), stdout.String())
		assert.Equal(t, fmt.Sprintf("e%d\n", i), stderr.String())
	}
	t.Logf("%d commands in %s (%s each)", n, time.Since(start), time.Since(start)/n)

	// Under the run's own policy, as taskrun exec.
	var policy lockedbuf.Buffer
	res, err := c.Exec(ctx, runID, daemon.ExecRequest{Argv: []string{"sh", "-c", "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status"}}, &policy, &policy)
	require.NoError(t, err)
	require.Equal(t, 0, res.Exit, policy.String())
	assert.NotEqual(t, "0", strings.SplitN(policy.String(), "\n", 2)[0], "the command runs as the run's uid")
	assert.Regexp(t, `CapEff:\s+0000000000000000`, policy.String())
	assert.Regexp(t, `NoNewPrivs:\s+1`, policy.String())

	// Another tenant gets not-found for every call on the run, and the run
	// goes on.
	assert.Equal(t, "404", asNobody(t, d.sock, "POST", "/v1/runs/"+runID+"/exec", `{"argv":["touch","/tmp/pwned"]}`))
	assert.Equal(t, "404", asNobody(t, d.sock, "POST", "/v1/runs/"+runID+"/cancel", ""))
	var probe lockedbuf.Buffer
	res, err = c.Exec(ctx, runID, daemon.ExecRequest{Argv: []string{"sh", "-c", "test ! -e /tmp/pwned && echo alive"}}, &probe, &probe)
	require.NoError(t, err)
	assert.Equal(t, 0, res.Exit, "another tenant's command ran in the run")
	assert.Equal(t, "alive\n", probe.String())

	rec := e.stopLive(t, d, runID)
	require.Len(t, rec.Execs, n+2, "every command is in the run's record")
	assert.Equal(t, 1, rec.Execs[1].Exit)
	assert.Contains(t, rec.Execs[0].By, "through the taskrun daemon")
	e.requireNothingLeft(t, runID)

	// A stopped run takes no more calls.
	_, err = c.Exec(ctx, runID, daemon.ExecRequest{Argv: []string{"true"}}, &probe, &probe)
	assert.ErrorIs(t, err, daemon.ErrRefused)
}

// The file API reads, writes, lists, stats and removes files under a live
// run's home, as the agent sees them; a path or an agent's symlink that
// leads out of the home is refused, and another tenant finds nothing.
func TestDaemonLiveRunFiles(t *testing.T) {
	e := newCrashEnv(t)
	d := startLiveDaemon(t, e)
	runID := d.detach(t, e, "file")
	ctx := context.Background()
	c := dialDaemon(t, d)
	exe := func(script string) string {
		var out lockedbuf.Buffer
		res, err := c.Exec(ctx, runID, daemon.ExecRequest{Argv: []string{"sh", "-c", script}}, &out, &out)
		require.NoError(t, err)
		require.Equal(t, 0, res.Exit, out.String())
		return out.String()
	}

	ops := 0
	for i := 0; i < 40; i++ {
		name := fmt.Sprintf("f%02d.txt", i)
		body := []byte(strings.Repeat(name, i+1))
		require.NoError(t, c.WriteFile(ctx, runID, name, body))
		got, err := c.ReadFile(ctx, runID, name)
		require.NoError(t, err)
		assert.Equal(t, body, got)
		fi, err := c.Stat(ctx, runID, name)
		require.NoError(t, err)
		assert.Equal(t, int64(len(body)), fi.Size)
		list, err := c.List(ctx, runID, ".")
		require.NoError(t, err)
		assert.NotEmpty(t, list)
		ops += 4
		if i%2 == 1 {
			require.NoError(t, c.Remove(ctx, runID, name))
			_, err := c.ReadFile(ctx, runID, name)
			var re *daemon.RefusedError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, 404, re.Status)
			ops += 2
		}
	}
	require.GreaterOrEqual(t, ops, 200)
	// The agent sees what was written, as its own; what it writes is read.
	assert.Equal(t, "f00.txt\n", exe(`cat $HOME/f00.txt; echo; test -O $HOME/f00.txt`))
	exe(`echo from-agent > $HOME/agent.txt`)
	got, err := c.ReadFile(ctx, runID, "agent.txt")
	require.NoError(t, err)
	assert.Equal(t, "from-agent\n", string(got))

	// The agent's hostile symlinks, and a traversal, lead nowhere.
	exe(`ln -s /etc $HOME/etc; ln -s / $HOME/slash; ln -s /etc/hostname $HOME/hostname`)
	for _, p := range []string{"etc/hostname", "slash/etc/hostname", "hostname", "../../../../etc/hostname", "/../../etc/hostname"} {
		_, err := c.ReadFile(ctx, runID, p)
		var re *daemon.RefusedError
		require.ErrorAs(t, err, &re, "read %s", p)
		assert.Equal(t, 400, re.Status, "read %s: %v", p, err)
	}
	outside := filepath.Join(t.TempDir(), "outside")
	exe(`ln -s ` + outside + ` $HOME/out`)
	for _, p := range []string{"out", "slash" + outside, "../outside"} {
		err := c.WriteFile(ctx, runID, p, []byte("escaped"))
		var re *daemon.RefusedError
		require.ErrorAs(t, err, &re, "write %s", p)
		assert.Equal(t, 400, re.Status, "write %s: %v", p, err)
	}
	assert.NoFileExists(t, outside)
	_, err = c.List(ctx, runID, "slash")
	assert.Error(t, err, "listing through a symlink to /")

	// Another tenant finds nothing.
	for _, m := range []string{"GET", "PUT", "DELETE"} {
		assert.Equal(t, "404", asNobody(t, d.sock, m, "/v1/runs/"+runID+"/files?path=f00.txt", "x"), m)
	}
	assert.Equal(t, "404", asNobody(t, d.sock, "GET", "/v1/runs/"+runID+"/files?path=.&op=list", ""))
	got, err = c.ReadFile(ctx, runID, "f00.txt")
	require.NoError(t, err)
	assert.Equal(t, "f00.txt", string(got))

	e.stopLive(t, d, runID)
	e.requireNothingLeft(t, runID)
}

// A live run that took a warm container (labelled before the run claimed
// it) takes commands too.
func TestDaemonLiveRunOnAWarmContainer(t *testing.T) {
	e := newCrashEnv(t)
	d := startLiveDaemon(t, e, "--warm", "1")
	time.Sleep(testdeadline.Scale(3 * time.Second)) // the pool fills
	runID := d.detach(t, e, "warm")
	c := dialDaemon(t, d)
	var out lockedbuf.Buffer
	res, err := c.Exec(context.Background(), runID, daemon.ExecRequest{Argv: []string{"echo", "warm"}}, &out, &out)
	require.NoError(t, err, "%s", d.log)
	assert.Equal(t, 0, res.Exit)
	assert.Equal(t, "warm\n", out.String())
	e.stopLive(t, d, runID)
}

// A live run no call touches is stopped at the daemon's --max-idle.
func TestDaemonStopsAnIdleLiveRun(t *testing.T) {
	e := newCrashEnv(t)
	d := startLiveDaemon(t, e, "--max-idle", "5s")
	runID := d.detach(t, e, "idle")
	start := time.Now()
	rec := e.endedRecord(t, runID)
	assert.Equal(t, model.StatusCancelled, rec.Status)
	assert.Less(t, time.Since(start), testdeadline.Scale(45*time.Second))
	assert.Contains(t, d.log.String(), "live run idle")
	e.requireNothingLeft(t, runID)
}

// runTaskrun is `taskrun ARGS` against the daemon at d's socket.
func runTaskrun(t *testing.T, d *daemonProc, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(taskrunBin(t), args...)
	cmd.Env = append(cmd.Environ(), daemon.EnvSocket+"="+d.sock)
	var stdout, stderr lockedbuf.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return stdout.String(), stderr.String(), ee.ExitCode()
	}
	require.NoError(t, err)
	return stdout.String(), stderr.String(), 0
}

// taskrun pause pauses a live run of the daemon through its host: on runc,
// which keeps no memory, the checkpoint keeps the run's files only and the
// command says so; the run's record is PAUSED and the host holds nothing
// of it. Another tenant cannot pause it.
func TestDaemonPausesALiveRun(t *testing.T) {
	e := newCrashEnv(t)
	d := startLiveDaemon(t, e)
	runID := d.detach(t, e, "pause")
	assert.Equal(t, "404", asNobody(t, d.sock, "POST", "/v1/runs/"+runID+"/pause", ""))

	out, stderr, code := runTaskrun(t, d, "pause", runID)
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d.log)
	assert.Contains(t, out, "run "+runID+" PAUSED")
	assert.Contains(t, out, "keeps files")
	assert.Contains(t, out, "only its files are kept")
	rec := e.endedRecord(t, runID)
	assert.Equal(t, model.StatusPaused, rec.Status)
	e.requireNothingLeft(t, runID)

	// Resumed, it is live again, and stops as any live run.
	assert.Equal(t, "404", asNobody(t, d.sock, "POST", "/v1/runs/"+runID+"/resume", ""))
	out, stderr, code = runTaskrun(t, d, "resume", runID)
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d.log)
	assert.Equal(t, runID, strings.TrimSpace(out))
	e.stopLive(t, d, runID)
	e.requireNothingLeft(t, runID)
}
