package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// The daemon tests run `taskrun daemon` and its clients as child processes,
// the clients of another tenant as uid 65534 (nobody).

// nobody is the unprivileged uid (and gid) a second tenant's client runs as.
const nobody = 65534

// daemonProc is a running `taskrun daemon`.
type daemonProc struct {
	cmd  *exec.Cmd
	sock string
	log  *lockedbuf.Buffer
}

// shareDir makes a directory every uid can enter, removed at cleanup.
func shareDir(t *testing.T, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// startDaemon starts a daemon on e's root and store, listening at sock, and
// waits until it answers. It is stopped (SIGTERM) at cleanup.
func startDaemon(t *testing.T, e *crashEnv, sock string, extra ...string) *daemonProc {
	t.Helper()
	args := append([]string{"daemon", "--root", e.root, "--store", e.store, "--image", testImage, "--helpers-dir", e.helpers}, extra...)
	return serveDaemon(t, e.command(t, []string{daemon.EnvSocket + "=" + sock}, args...), sock)
}

// serveDaemon starts the daemon command cmd, which serves at sock, and
// waits until it answers. It is stopped (SIGTERM) at cleanup.
func serveDaemon(t *testing.T, cmd *exec.Cmd, sock string) *daemonProc {
	t.Helper()
	d := &daemonProc{cmd: cmd, sock: sock, log: &lockedbuf.Buffer{}}
	cmd.Stdout, cmd.Stderr = d.log, d.log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-done
		}
		t.Logf("daemon log:\n%s", d.log)
	})
	// It listens at once, and serves once it recovered what was left.
	require.Eventually(t, func() bool {
		return strings.Contains(d.log.String(), "taskrun daemon serving")
	}, testdeadline.Scale(time.Minute), 20*time.Millisecond, "the daemon never served: %s", d.log)
	c, err := net.Dial("unix", sock)
	require.NoError(t, err)
	c.Close()
	return d
}

// client is `taskrun run ARGS` against the daemon at sock, as uid (0: the
// test's own).
func (d *daemonProc) client(t *testing.T, uid uint32, args ...string) *exec.Cmd {
	t.Helper()
	bin := taskrunBin(t)
	// The binary's directory must be open to the other uid.
	require.NoError(t, os.Chmod(filepath.Dir(bin), 0o755))
	cmd := exec.Command(bin, append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), daemon.EnvSocket+"="+d.sock)
	cmd.Dir = "/"
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	}
	return cmd
}

// runClient runs a client to its end: stdout, stderr and exit status.
func (d *daemonProc) runClient(t *testing.T, uid uint32, args ...string) (string, string, int) {
	t.Helper()
	cmd := d.client(t, uid, args...)
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

// storedNames are the names of a --json result's stored objects.
func storedNames(t *testing.T, jsonOut string) []string {
	t.Helper()
	var res jsonResult
	require.NoError(t, json.Unmarshal([]byte(jsonOut), &res), "%s", jsonOut)
	var names []string
	for _, o := range res.Stored {
		names = append(names, filepath.Base(o.Key))
	}
	slices.Sort(names)
	return names
}

func TestDaemonRunMatchesInProcess(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "note.txt"), []byte("from the workspace\n"), 0o644))
	script := "cat note.txt; echo err >&2; echo changed > new.txt; printf tail; exit 7"

	// Streamed output and exit status, through the daemon.
	stdout, stderr, code := d.runClient(t, 0, "--user", e.user, "--image", testImage, "--workspace", ws, "--", "sh", "-c", script)
	assert.Equal(t, 7, code, stderr)
	assert.Equal(t, "from the workspace\ntail", stdout)
	assert.Contains(t, stderr, "err\n")
	assert.Contains(t, stderr, "FAILED (exit 7")
	assert.Contains(t, stderr, "stored in "+e.store, "the summary names the daemon's store")

	// The same run, --json, through the daemon and in this process.
	viaDaemon, derr, dcode := d.runClient(t, 0, "--user", e.user, "--image", testImage, "--workspace", ws, "--json", "--", "sh", "-c", script)
	local := e.command(t, nil, e.runArgs("local"+strings.ToLower(tenant(t)[:6]), []string{"--workspace", ws, "--json", "--local"}, "sh", "-c", script)...)
	local.Env = append(local.Env, daemon.EnvSocket+"="+d.sock)
	var lout, lerr lockedbuf.Buffer
	local.Stdout, local.Stderr = &lout, &lerr
	lcode := 0
	var exitErr *exec.ExitError
	if err := local.Run(); errors.As(err, &exitErr) {
		lcode = exitErr.ExitCode()
	}
	assert.Equal(t, lcode, dcode, "daemon: %s\nlocal: %s", derr, &lerr)
	assert.Equal(t, 7, dcode)
	var dres, lres jsonResult
	require.NoError(t, json.Unmarshal([]byte(viaDaemon), &dres), viaDaemon)
	require.NoError(t, json.Unmarshal([]byte(lout.String()), &lres), lout.String())
	assert.Equal(t, lres.Status, dres.Status)
	assert.Equal(t, lres.Reason, dres.Reason)
	assert.Equal(t, lres.ImageDigest, dres.ImageDigest)
	require.NotNil(t, dres.Changes)
	require.NotNil(t, lres.Changes)
	assert.Equal(t, lres.Changes.Files, dres.Changes.Files, "the change sets differ")
	assert.Equal(t, storedNames(t, lout.String()), storedNames(t, viaDaemon), "the runs stored different objects")
	assert.Contains(t, derr, "from the workspace\n", "with --json the run's stdout goes to stderr")
	assert.Equal(t, "from the workspace\ntail", e.outputLog(t, dres.RunID), "the daemon's run stored its output under the tenant given")
}

func TestDaemonCtrlCCancelsTheRun(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	runID := "intr" + strings.ToLower(tenant(t)[:8])
	cmd := d.client(t, 0, "--user", e.user, "--run-id", runID, "--image", testImage, "--", printer[0], printer[1], printer[2])
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedbuf.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	for i := 0; i < 5 && lines.Scan(); i++ {
	}
	// Another uid cannot cancel it: the daemon answers as if it did not
	// exist, and the run goes on.
	if curl, err := exec.LookPath("curl"); err == nil {
		c := exec.Command(curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", d.sock, "-X", "POST", "http://taskrun/v1/runs/"+runID+"/cancel")
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		code, err := c.Output()
		require.NoError(t, err)
		assert.Equal(t, "404", string(code), "uid %d cancelled another tenant's run", nobody)
		for i := 0; i < 5; i++ {
			require.True(t, lines.Scan(), "the run stopped after another uid's cancel: %s", &stderr)
		}
	} else {
		t.Log("no curl: the other uid's cancel is not tried")
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, "%s", &stderr)
		assert.Equal(t, exitInterrupted, exitErr.ExitCode(), "%s", &stderr)
	case <-time.After(testdeadline.Scale(time.Minute)):
		t.Fatalf("Ctrl-C did not end the run: %s", &stderr)
	}
	assert.Contains(t, stderr.String(), string(model.StatusCancelled), "the summary reports the cancelled run")
	assert.GreaterOrEqual(t, requireNumberedLines(t, e.outputLog(t, runID)), 5, "the cancelled run's output is stored")
	e.requireNothingLeft(t, runID)
}

// TestDaemonSecondCtrlCDetaches sends two SIGINTs: the client exits at
// once and the daemon finishes the cancelled run on its own.
func TestDaemonSecondCtrlCDetaches(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	runID := "detach" + strings.ToLower(tenant(t)[:8])
	// The agent ignores SIGTERM: the run's wind-down takes the engine's
	// stop timeout, well after the client left.
	cmd := d.client(t, 0, "--user", e.user, "--run-id", runID, "--image", testImage, "--", "sh", "-c",
		`trap "" TERM; i=0; while true; do echo "line $i"; i=$((i+1)); sleep 0.02; done`)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedbuf.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	for i := 0; i < 5 && lines.Scan(); i++ {
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, "%s", &stderr)
		assert.Equal(t, exitInterrupted, exitErr.ExitCode())
	case <-time.After(5 * time.Second):
		t.Fatalf("a second Ctrl-C did not end the client: %s", &stderr)
	}
	assert.Contains(t, stderr.String(), "the daemon finishes run "+runID)
	out, err := exec.Command("docker", "ps", "-q", "--filter", "label="+sandbox.LabelRun+"="+runID).Output()
	require.NoError(t, err)
	assert.NotEmpty(t, strings.TrimSpace(string(out)), "the run was still winding down when the client left")
	// The daemon finishes it: stored, nothing left.
	jd, err := taskrun.OpenRunJournal(e.root)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := jd.Load(runID)
		return errors.Is(err, journal.ErrNotFound)
	}, testdeadline.Scale(2*time.Minute), 100*time.Millisecond, "the daemon never finished the run: %s", d.log)
	e.requireNothingLeft(t, runID)
	assert.GreaterOrEqual(t, requireNumberedLines(t, e.outputLog(t, runID)), 5)
	assert.Contains(t, d.log.String(), "status=CANCELLED")
}

// With no daemon at the socket (a stale socket of a killed one), taskrun run
// runs in its own process, with its default root and store.
func TestRunWithoutADaemonRunsInProcess(t *testing.T) {
	e := newCrashEnv(t)
	sock := filepath.Join(t.TempDir(), "taskrun.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	require.FileExists(t, sock)
	d := &daemonProc{sock: sock}
	cwd := t.TempDir()
	cmd := d.client(t, 0, "--user", e.user, "--image", testImage, "--", "sh", "-c", "echo here")
	cmd.Dir = cwd
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "here\n")
	assert.DirExists(t, filepath.Join(cwd, ".taskrun", "store", "tenants", e.user), "the run used the in-process default store")
	t.Cleanup(func() {
		gc := e.command(t, nil, "gc", "--root", filepath.Join(cwd, ".taskrun", "runtime"))
		_ = gc.Run()
	})
}

// `taskrun daemon --warm 1` parks a container of its default key; a
// client's run that asks for nothing else claims it, the pool refills, and
// the stopped daemon leaves no parked container.
func TestDaemonWarmFlag(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"), "--warm", "1")
	parked := func() []string {
		out, err := exec.Command("docker", "ps", "-a", "--filter", "label=dev.taskrun.pool",
			"--format", `{{.ID}} {{.Label "dev.taskrun.run-dir"}}`).Output()
		require.NoError(t, err)
		var ids []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if id, dir, _ := strings.Cut(line, " "); strings.HasPrefix(dir, e.root+"/") {
				ids = append(ids, id)
			}
		}
		return ids
	}
	require.Eventually(t, func() bool { return len(parked()) == 1 }, testdeadline.Scale(2*time.Minute), 50*time.Millisecond, "the daemon parks a container: %s", d.log)
	out, stderr, code := d.runClient(t, 0, "--user", e.user, "--json", "--", "sh", "-c", "echo warm")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "warm\n")
	var res jsonResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	claimed := slices.ContainsFunc(res.Timings, func(s timings.Span) bool { return s.Phase == timings.WarmClaim })
	assert.True(t, claimed, "the run did not claim the parked container: %+v", res.Timings)
	require.Eventually(t, func() bool { return len(parked()) == 1 }, testdeadline.Scale(2*time.Minute), 50*time.Millisecond, "the pool refills")
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return len(parked()) == 0 }, testdeadline.Scale(time.Minute), 50*time.Millisecond, "the stopped daemon left a parked container")
}

// TestDaemonCancelsTheRunOfAClientThatWentAway kills the client (no
// cancel request, just the connection closed), with and without a
// workspace: the daemon cancels the run and cleans up.
func TestDaemonCancelsTheRunOfAClientThatWentAway(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "f"), []byte("x"), 0o644))
	for i, extra := range [][]string{nil, {"--workspace", ws}} {
		runID := fmt.Sprintf("gone%d%s", i, strings.ToLower(tenant(t)[:8]))
		args := append(append([]string{"--user", e.user, "--run-id", runID, "--image", testImage}, extra...), "--")
		cmd := d.client(t, 0, append(args, printer...)...)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		lines := bufio.NewScanner(stdout)
		for i := 0; i < 5 && lines.Scan(); i++ {
		}
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()
		jd, err := taskrun.OpenRunJournal(e.root)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			_, err := jd.Load(runID)
			return errors.Is(err, journal.ErrNotFound)
		}, testdeadline.Scale(time.Minute), 50*time.Millisecond, "the daemon never ended the run: %s", d.log)
		e.requireNothingLeft(t, runID)
		assert.Regexp(t, `run ended.*run=`+runID+`.*status=CANCELLED.*client_gone=true|run=`+runID+`.*status=CANCELLED`, d.log.String())
	}
}

// TestDaemonRefusesWhatTheTenantMayNotAsk runs clients as uid 65534: their
// runs are theirs only, within the operator's maxima and egress, with a
// workspace they can read.
func TestDaemonRefusesWhatTheTenantMayNotAsk(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"), "--max-run-memory", "1g", "--allow", "example.com")
	tenantName, err := daemon.UserNameTenant(nobody)
	require.NoError(t, err)

	// Its own run works: the refusals below are about what it asks.
	stdout, stderr, code := d.runClient(t, nobody, "--image", testImage, "--", "sh", "-c", "echo ok")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "ok\n", stdout)
	assert.Contains(t, stderr, "tenants/"+tenantName+"/", "the run is stored under the peer's tenant")

	cases := []struct {
		name string
		args []string
		want string
	}{
		{"another tenant", []string{"--user", e.user}, `runs as tenant "` + tenantName + `" only`},
		{"a higher limit", []string{"--memory", "2g"}, "over the maximum"},
		{"wider egress", []string{"--allow", "example.org"}, "is within no rule of this host's"},
		{"a host file as script", []string{"--model", "scripted:/etc/shadow"}, "read a file for you"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append(append([]string{"--image", testImage}, c.args...), "--", "true")
			_, stderr, code := d.runClient(t, nobody, args...)
			assert.Equal(t, exitCannotRun, code, stderr)
			assert.Contains(t, stderr, "refused")
			assert.Contains(t, stderr, c.want)
		})
	}
	// Within the operator's word, the same asks pass.
	_, stderr, code = d.runClient(t, nobody, "--image", testImage, "--memory", "512m", "--allow", "example.com", "--", "true")
	assert.Equal(t, 0, code, stderr)

	t.Run("an unreadable workspace", func(t *testing.T) {
		secret := shareDir(t, "taskrun-secret-")
		require.NoError(t, os.WriteFile(filepath.Join(secret, "key"), []byte("root only\n"), 0o600))
		require.NoError(t, os.Chmod(secret, 0o700))
		_, stderr, code := d.runClient(t, nobody, "--image", testImage, "--workspace", secret, "--", "true")
		assert.Equal(t, exitCannotRun, code, stderr)
		assert.Contains(t, stderr, "permission denied")
		assert.NotContains(t, stderr, "RUNNING")

		// A readable directory holding an unreadable file: the file never
		// reaches the run.
		ws := shareDir(t, "taskrun-ws-")
		require.NoError(t, os.WriteFile(filepath.Join(ws, "open"), []byte("anyone\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(ws, "key"), []byte("root only\n"), 0o600))
		stdout, stderr, code := d.runClient(t, nobody, "--image", testImage, "--workspace", ws, "--", "sh", "-c", "cat open; cat key || echo no key")
		assert.Equal(t, 0, code, stderr)
		assert.Equal(t, "anyone\nno key\n", stdout)
		assert.NotContains(t, stderr, "root only")
	})
}

// A daemon that is stopped (SIGTERM) cancels its live runs, stores them and
// gives their clients the result before it exits.
func TestDaemonStopCancelsItsRunsAndAnswersTheirClients(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	runID := "dstop" + strings.ToLower(tenant(t)[:8])
	cmd := d.client(t, 0, append([]string{"--user", e.user, "--run-id", runID, "--image", testImage, "--"}, printer...)...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedbuf.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	for i := 0; i < 5 && lines.Scan(); i++ {
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	err = cmd.Wait()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "%s", &stderr)
	assert.Equal(t, exitInterrupted, exitErr.ExitCode(), "%s", &stderr)
	assert.Contains(t, stderr.String(), string(model.StatusCancelled))
	e.requireNothingLeft(t, runID)
	assert.GreaterOrEqual(t, requireNumberedLines(t, e.outputLog(t, runID)), 5)
}

// A daemon killed mid-run: its client says so, naming the run; the next
// daemon recovers the run at start.
func TestDaemonKilledMidRunIsRecoveredByTheNext(t *testing.T) {
	e := newCrashEnv(t)
	sock := filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock")
	d := startDaemon(t, e, sock)
	runID := "dkill" + strings.ToLower(tenant(t)[:8])
	cmd := d.client(t, 0, "--user", e.user, "--run-id", runID, "--image", testImage, "--", printer[0], printer[1], printer[2])
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedbuf.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	for i := 0; i < 5 && lines.Scan(); i++ {
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	require.NoError(t, d.cmd.Process.Signal(syscall.SIGKILL))
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr)
		assert.Equal(t, exitCannotRun, exitErr.ExitCode())
	case <-time.After(testdeadline.Scale(time.Minute)):
		t.Fatalf("the client did not notice the daemon's death: %s", &stderr)
	}
	assert.Contains(t, stderr.String(), "went away")
	assert.Contains(t, stderr.String(), runID, "the error names the run")
	// The agent still runs: nobody stopped it.
	out, err := exec.Command("docker", "ps", "-q", "--filter", "label="+sandbox.LabelRun+"="+runID).Output()
	require.NoError(t, err)
	require.NotEmpty(t, strings.TrimSpace(string(out)), "the killed daemon's container should still run")

	// The next daemon recovers it at start.
	d2 := startDaemon(t, e, sock)
	assert.Contains(t, d2.log.String(), runID, "the restarted daemon reports the recovered run")
	e.requireNothingLeft(t, runID)
	assert.GreaterOrEqual(t, requireNumberedLines(t, e.outputLog(t, runID)), 5)
}
