package faults

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
)

// privateDockerd is a Docker engine of the test's own: its data root, exec
// root, pid file and socket are under dir, it runs in a network namespace of
// its own with no bridge and touches no iptables, so pausing or killing it
// harms nothing else on the machine.
type privateDockerd struct {
	dir  string
	sock string
	cmd  *exec.Cmd
	done chan struct{}
}

// startPrivateDockerd starts a private engine and loads the test image from
// the machine's engine into it. It skips when not root or dockerd is
// missing, unless CI=true and both are there. Everything is removed when t
// ends: the engine, its containerd, shims, mounts and directories.
func startPrivateDockerd(t *testing.T) *privateDockerd {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a Docker engine")
	}
	if os.Geteuid() != 0 {
		t.Skip("a private dockerd needs root")
	}
	bin, err := exec.LookPath("dockerd")
	if err != nil {
		t.Skip("no dockerd on PATH")
	}
	// A short path: containerd's socket under the exec root must fit a
	// unix socket address.
	dir, err := os.MkdirTemp("", "trf-")
	require.NoError(t, err)
	d := &privateDockerd{dir: dir, sock: filepath.Join(dir, "docker.sock")}
	t.Cleanup(d.remove)
	// An empty config file: the machine's daemon.json names the main
	// engine's data root and storage driver.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}\n"), 0o600))
	d.start(t, bin)
	load := exec.Command("sh", "-c", fmt.Sprintf("docker save %s | docker -H %s load", testImage, d.host()))
	out, err := load.CombinedOutput()
	require.NoError(t, err, "load %s into the private engine (make images builds it): %s", testImage, out)
	return d
}

// host is the engine's DOCKER_HOST.
func (d *privateDockerd) host() string { return "unix://" + d.sock }

// start starts dockerd and waits until it answers.
func (d *privateDockerd) start(t *testing.T, bin string) {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(d.dir, "dockerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(t, err)
	d.cmd = exec.Command(bin, "--config-file", filepath.Join(d.dir, "daemon.json"),
		"--data-root", filepath.Join(d.dir, "data"), "--exec-root", filepath.Join(d.dir, "exec"),
		"--pidfile", filepath.Join(d.dir, "dockerd.pid"), "-H", d.host(),
		"--bridge=none", "--iptables=false", "--ip-masq=false", "--storage-driver=vfs")
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	// A network namespace of its own: a dockerd started with --bridge=none
	// deletes the docker0 interface it finds, which would cut the main
	// engine's default bridge. Its socket is a file, reached from here.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	require.NoError(t, d.cmd.Start())
	d.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}(d.cmd, d.done)
	deadline := time.Now().Add(testdeadline.Scale(time.Minute))
	for {
		if err := exec.Command("docker", "-H", d.host(), "version").Run(); err == nil {
			return
		}
		select {
		case <-d.done:
			t.Fatalf("the private dockerd exited: %s", d.log())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the private dockerd did not answer: %s", d.log())
		}
	}
}

// restart starts the engine again on the same directories, after kill.
func (d *privateDockerd) restart(t *testing.T) {
	t.Helper()
	d.start(t, d.cmd.Path)
}

// signal sends sig to dockerd.
func (d *privateDockerd) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(sig))
}

// kill SIGKILLs dockerd and waits until it is gone.
func (d *privateDockerd) kill(t *testing.T) {
	t.Helper()
	d.signal(t, syscall.SIGKILL)
	<-d.done
}

// ps lists the engine's containers (all states) carrying label.
func (d *privateDockerd) ps(t *testing.T, label string) []string {
	t.Helper()
	out, err := exec.Command("docker", "-H", d.host(), "ps", "-aq", "--filter", "label="+label).Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

// log is the tail of the engine's log.
func (d *privateDockerd) log() string {
	data, _ := os.ReadFile(filepath.Join(d.dir, "dockerd.log"))
	if len(data) > 3000 {
		data = data[len(data)-3000:]
	}
	return string(data)
}

// remove stops the engine and removes everything it left: containers,
// its containerd and the shims under its exec root, mounts under its
// directory, and the directory.
func (d *privateDockerd) remove() {
	if d.cmd != nil {
		select {
		case <-d.done:
		default:
			_ = exec.Command("sh", "-c", fmt.Sprintf("docker -H %s ps -aq | xargs -r docker -H %s rm -f", d.host(), d.host())).Run()
			_ = d.cmd.Process.Signal(syscall.SIGCONT)
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.done:
			case <-time.After(30 * time.Second):
				_ = d.cmd.Process.Kill()
				<-d.done
			}
		}
	}
	// containerd and its shims run with the exec root on their command line.
	for _, pid := range pidsMentioning(filepath.Join(d.dir, "exec")) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	unmountUnder(d.dir)
	_ = os.RemoveAll(d.dir)
}

// pidsMentioning lists the processes whose command line contains s.
func pidsMentioning(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// unmountUnder lazily unmounts every mount under dir, deepest first.
func unmountUnder(dir string) {
	data, _ := os.ReadFile("/proc/mounts")
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			points = append(points, f[1])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}

// waitExit waits for p's exit for at most d: it returns what Wait returned
// and whether the exit came.
func waitExit(p *proc, d time.Duration) (error, bool) {
	select {
	case <-p.done:
		return p.err, true
	case <-time.After(d):
		return nil, false
	}
}

// exitCode is the exit code err carries, 0 for nil, -1 for another error.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// proc is a started taskrun process; done is closed at its exit, when err
// holds what Wait returned.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr lockedbuf.Buffer
	done           chan struct{}
	err            error
}

// start starts cmd with its output in buffers; it is killed when t ends if
// still running.
func start(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.stdout, &p.stderr
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("%s stderr:\n%s", cmd.Args[1], tail(p.stderr.String(), 3000))
		}
	})
	return p
}

// waitLines waits until the process printed at least n lines on stdout.
func (p *proc) waitLines(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return strings.Count(p.stdout.String(), "\n") >= n
	}, testdeadline.Scale(2*time.Minute), 20*time.Millisecond, "the run never printed %d lines: %s", n, &p.stderr)
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// dockerdPause is how long TestDockerdPausedMidRun... stops the engine: the
// trial paused it 60 s; every engine call of the run waits the same way for
// 20 s, so the case runs with 20 s unless told otherwise.
var dockerdPause = flag.Duration("faults.dockerd-pause", 20*time.Second, "how long the engine-pause case stops the private dockerd")

// The engine stopped (SIGSTOP) for a while mid-run is only a delay: every
// call the executor makes waits it out, the run ends SUCCEEDED with every
// byte the agent printed, in its output and in the store, indexed once, and
// leaves nothing behind. It fails if any engine call of the run (log
// stream, wait, inspect, remove) gave up within the pause, or if output
// printed while the engine was stopped were lost.
func TestDockerdPausedMidRunTheRunCompletesWithAllItsOutput(t *testing.T) {
	d := startPrivateDockerd(t)
	e := newEnv(t, "DOCKER_HOST="+d.host())
	runID := "pause" + randomID()
	// About 10 s of printing: the agent ends while the engine is stopped.
	const lines = 400
	run := start(t, e.command(t, e.runArgs(runID, []string{"--disk", "64m", "--timeout", "10m"}, printer(lines)...)...))
	run.waitLines(t, 20)

	d.signal(t, syscall.SIGSTOP)
	paused := time.Now()
	err, ended := waitExit(run, *dockerdPause)
	d.signal(t, syscall.SIGCONT)
	require.False(t, ended, "the run ended %s into the engine's pause: %v\n%s", time.Since(paused), err, &run.stderr)
	t.Logf("engine resumed after %s, %d lines printed", time.Since(paused), strings.Count(run.stdout.String(), "\n"))

	err, ended = waitExit(run, testdeadline.Scale(2*time.Minute))
	require.True(t, ended, "the run did not end after the engine resumed: %s", &run.stderr)
	require.NoError(t, err, "the run failed: %s", &run.stderr)
	out := run.stdout.String()
	require.Equal(t, lines, requireNumberedLines(t, out), "the run's output lacks lines")
	require.Equal(t, out, e.outputLog(t, runID), "the stored output.log is not what the run printed")
	e.requireIndexedOnce(t, model.StatusSucceeded)
	require.Empty(t, d.ps(t, "dev.taskrun.run="+runID), "a container of the run is left")
	e.requireNoLocalTrace(t, runID)
}

// The engine killed (SIGKILL) mid-run and restarted: the run ends FAILED
// within a bounded time with a reason naming the engine; what the agent
// printed up to the kill is persisted (output.log starts with every byte
// the run printed); and `taskrun gc` reaps what the crash left in the
// engine (the dead container) and on the host, leaving one FAILED record.
// It fails if the executor hung on the dead engine, reported success, lost
// the streamed output, or if gc spared the container forever.
func TestDockerdKilledMidRunFailsNamingTheEngineAndGCReaps(t *testing.T) {
	d := startPrivateDockerd(t)
	e := newEnv(t, "DOCKER_HOST="+d.host())
	runID := "kill" + randomID()
	run := start(t, e.command(t, e.runArgs(runID, []string{"--disk", "64m", "--timeout", "10m"}, printer(0)...)...))
	run.waitLines(t, 20)

	d.kill(t)
	killed := time.Now()
	err, ended := waitExit(run, testdeadline.Scale(2*time.Minute))
	require.True(t, ended, "the run hangs on the dead engine: %s", &run.stderr)
	t.Logf("the run ended %s after the engine's kill (exit %d):\n%s", time.Since(killed), exitCode(err), tail(run.stderr.String(), 2000))
	require.Error(t, err, "the run succeeded although its engine was killed")
	printed := run.stdout.String()
	d.restart(t)

	gc := start(t, e.command(t, "gc", "--root", e.root))
	err, ended = waitExit(gc, testdeadline.Scale(2*time.Minute))
	require.True(t, ended, "gc hangs")
	require.NoError(t, err, "gc: %s %s", &gc.stdout, &gc.stderr)
	t.Logf("gc:\n%s\n%s", &gc.stdout, &gc.stderr)
	require.Empty(t, d.ps(t, "dev.taskrun.run="+runID), "gc left a container of the run: %s", &gc.stdout)
	e.requireNoLocalTrace(t, runID)

	stored := e.outputLog(t, runID)
	requireNumberedLines(t, stored)
	require.True(t, strings.HasPrefix(stored, printed), "output.log lacks what the run printed before the engine died")
	rec := e.requireIndexedOnce(t, model.StatusFailed)
	require.Contains(t, rec.Reason, d.sock, "the reason does not name the engine that failed")
}
