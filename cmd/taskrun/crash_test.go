package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/persist/s3test"
	"github.com/taskrun/taskrun/sandbox"

	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// The crash tests run the real binary as a child process, so that it can be
// killed, signalled and left behind as an operator's would be.

var (
	taskrunBinOnce sync.Once
	taskrunBinPath string
	taskrunBinErr  error
)

// taskrunBin is this package's binary: the one `make build` put in
// TASKRUN_BIN_DIR (testbin.EnvBinDir), or one built once per test process.
func taskrunBin(t *testing.T) string {
	t.Helper()
	taskrunBinOnce.Do(func() {
		if d := os.Getenv(testbin.EnvBinDir); d != "" {
			taskrunBinPath = filepath.Join(d, "taskrun")
			if _, taskrunBinErr = os.Stat(taskrunBinPath); taskrunBinErr != nil {
				taskrunBinErr = fmt.Errorf("%s=%s has no taskrun: run make build, or unset it: %w", testbin.EnvBinDir, d, taskrunBinErr)
			}
			return
		}
		dir, err := os.MkdirTemp("", "taskrun-crash-bin-")
		if err != nil {
			taskrunBinErr = err
			return
		}
		taskrunBinPath = filepath.Join(dir, "taskrun")
		cmd := exec.Command("go", "build", "-o", taskrunBinPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			taskrunBinErr = fmt.Errorf("go build: %w: %s", err, out)
		}
	})
	require.NoError(t, taskrunBinErr)
	return taskrunBinPath
}

// removeTaskrunBin removes the binary taskrunBin built; TestMain calls it.
func removeTaskrunBin() {
	if taskrunBinPath != "" && os.Getenv(testbin.EnvBinDir) == "" {
		_ = os.RemoveAll(filepath.Dir(taskrunBinPath))
	}
}

// crashEnv is one test's runs root, store and run identity.
type crashEnv struct {
	root, store, user string
	helpers           string
}

func newCrashEnv(t *testing.T) *crashEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real containers")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop-mounted disk caps")
	}
	return &crashEnv{root: t.TempDir(), store: "file://" + t.TempDir(), user: tenant(t), helpers: testbin.Dir(t)}
}

// command is the binary with args and the environment variables env.
func (e *crashEnv) command(t *testing.T, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(taskrunBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// runArgs are the arguments of `taskrun run` for runID, then cmd.
func (e *crashEnv) runArgs(runID string, extra []string, cmd ...string) []string {
	args := []string{"run", "--root", e.root, "--store", e.store, "--user", e.user, "--run-id", runID,
		"--image", testImage, "--helpers-dir", e.helpers, "--gc=false"}
	args = append(args, extra...)
	return append(append(args, "--"), cmd...)
}

// runDir is the run's directory.
func (e *crashEnv) runDir(runID string) string {
	return taskrun.NewRuntimePathsFromRoot(e.root).RuntimeTaskRunDir(e.user, defaultConversation, "default", runID)
}

// outputLog reads the run's output.log from the store.
func (e *crashEnv) outputLog(t *testing.T, runID string) string {
	t.Helper()
	st, err := persist.Open(context.Background(), e.store)
	require.NoError(t, err)
	defer st.Close()
	rc, err := st.OpenRunFile(context.Background(), persist.RunRef{UserID: e.user, ConversationID: defaultConversation, TaskID: "default", RunID: runID}, taskrun.OutputLogName)
	require.NoError(t, err)
	defer rc.Close()
	data, err := io.ReadAll(rc)
	require.NoError(t, err)
	return string(data)
}

// requireNothingLeft checks the host holds nothing of the run: no container,
// mount, loop device, disk-cap image, run dir or journal record.
func (e *crashEnv) requireNothingLeft(t *testing.T, runID string) {
	t.Helper()
	e.awaitJournalEnd(t, runID)
	out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=dev.taskrun.run="+runID).Output()
	require.NoError(t, err)
	assert.Empty(t, strings.TrimSpace(string(out)), "a container of the run is left")
	mounts, err := os.ReadFile("/proc/mounts")
	require.NoError(t, err)
	assert.NotContains(t, string(mounts), e.root+"/", "a mount under the runs root is left")
	loops, err := exec.Command("losetup", "-a").Output()
	require.NoError(t, err)
	assert.NotContains(t, string(loops), e.root+"/", "a loop device backed by a file under the runs root is left")
	assert.NoFileExists(t, diskcap.ImagePath(e.runDir(runID)))
	assert.NoDirExists(t, e.runDir(runID))
	assert.NoDirExists(t, e.runDir(runID)+".executor")
	jd, err := taskrun.OpenRunJournal(e.root)
	require.NoError(t, err)
	_, err = jd.Load(runID)
	assert.ErrorIs(t, err, journal.ErrNotFound)
}

// requireNumberedLines checks out is "line 0\n" ... "line N\n" and returns N+1.
func requireNumberedLines(t *testing.T, out string) int {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range lines {
		require.True(t, strings.HasPrefix(l, fmt.Sprintf("line %d", i)), "line %d is %q", i, l)
	}
	return len(lines)
}

// printer prints numbered lines every 20 ms, forever.
var printer = []string{"sh", "-c", `i=0; while true; do echo "line $i"; i=$((i+1)); sleep 0.02; done`}

// TestKilledExecutorIsRecoveredByGC kills `taskrun run` with SIGKILL while
// the agent prints, lets the agent print on, then runs `taskrun gc`.
func TestKilledExecutorIsRecoveredByGC(t *testing.T) {
	e := newCrashEnv(t)
	const token = "crash-token"
	cp := controlplanetest.New(t, token)
	runID := "kill" + strings.ToLower(tenant(t)[:8])

	run := e.command(t, []string{envToken + "=" + token}, e.runArgs(runID, []string{"--server", cp.URL(), "--disk", "64m"}, printer...)...)
	var runErr lockedbuf.Buffer
	run.Stderr = &runErr
	require.NoError(t, run.Start())
	t.Cleanup(func() { _ = run.Process.Kill(); _ = run.Wait() })
	t.Logf("started at %s", time.Now())
	defer func() { t.Logf("run stderr: %s", &runErr) }()
	require.Eventually(t, func() bool {
		data, _, _ := cp.Stream(runID)
		return strings.Count(string(data), "\n") >= 20
	}, 2*time.Minute, 50*time.Millisecond, "the run never streamed: %s", &runErr)

	require.NoError(t, run.Process.Signal(syscall.SIGKILL))
	_ = run.Wait()
	streamed, _, _ := cp.Stream(runID)
	// The agent prints on into the engine's log only: wait until it holds
	// the lines output.log must have beyond what was streamed.
	want := strings.Count(string(streamed), "\n") + 11
	require.Eventually(t, func() bool {
		id, err := exec.Command("docker", "ps", "-q", "--filter", "label="+sandbox.LabelRun+"="+runID).Output()
		if err != nil || len(bytes.TrimSpace(id)) == 0 {
			return false
		}
		logs, err := exec.Command("docker", "logs", string(bytes.TrimSpace(id))).Output()
		return err == nil && bytes.Count(logs, []byte("\n")) >= want
	}, testdeadline.Scale(time.Minute), 100*time.Millisecond, "the agent printed %d lines into the engine's log", want)
	require.NotEmpty(t, e.runDir(runID), "the killed run left its dir")
	assert.DirExists(t, e.runDir(runID))

	var gcOut, gcErr lockedbuf.Buffer
	gc := e.command(t, []string{envToken + "=" + token}, "gc", "--root", e.root)
	gc.Stdout, gc.Stderr = &gcOut, &gcErr
	start := time.Now()
	require.NoError(t, gc.Run(), "gc: %s %s", &gcOut, &gcErr)
	t.Logf("gc took %s:\n%s\n%s", time.Since(start), &gcOut, &gcErr)
	assert.Contains(t, gcOut.String(), "recovered run "+runID)

	e.requireNothingLeft(t, runID)
	out := e.outputLog(t, runID)
	n := requireNumberedLines(t, out)
	assert.Greater(t, n, strings.Count(string(streamed), "\n")+10, "output.log lacks what the agent printed after the kill")
	assert.True(t, strings.HasPrefix(out, string(streamed)), "output.log does not start with what was streamed")

	patches := cp.Patches(runID)
	require.NotEmpty(t, patches)
	final := patches[len(patches)-1]
	assert.Equal(t, model.StatusFailed, final.Status)
	require.NotNil(t, final.Error)
	assert.Contains(t, *final.Error, "executor lost")

	// Recovery finished the control plane's stream: all of output.log, ended.
	data, ended, _ := cp.Stream(runID)
	assert.Equal(t, out, string(data), "the control plane's stream lacks output the store has")
	assert.True(t, ended, "recovery did not end the output stream")

	// One record per run in the index: the FAILED one replaced the RUNNING one.
	st, err := persist.Open(context.Background(), e.store)
	require.NoError(t, err)
	defer st.Close()
	recs, err := runindex.List(context.Background(), st, runindex.Filter{UserID: e.user})
	require.NoError(t, err)
	require.Len(t, recs, 1, "the run is indexed once")
	assert.Equal(t, model.StatusFailed, recs[0].Status)
}

// TestSameRunIDTwiceRefusesTheSecond starts two runs with one run ID at once:
// the second is refused cleanly and the first runs to completion.
func TestSameRunIDTwiceRefusesTheSecond(t *testing.T) {
	e := newCrashEnv(t)
	runID := "dup" + strings.ToLower(tenant(t)[:8])
	first := e.command(t, nil, e.runArgs(runID, []string{"--disk", "32m"}, "sh", "-c", "sleep 3; echo first")...)
	var firstOut, firstErr lockedbuf.Buffer
	first.Stdout, first.Stderr = &firstOut, &firstErr
	require.NoError(t, first.Start())
	require.Eventually(t, func() bool {
		jd, err := taskrun.OpenRunJournal(e.root)
		if err != nil {
			return false
		}
		held, err := jd.Held(runID)
		return err == nil && held
	}, time.Minute, 20*time.Millisecond)

	second := e.command(t, nil, e.runArgs(runID, []string{"--disk", "32m"}, "sh", "-c", "echo second")...)
	out, err := second.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "%s", out)
	assert.Equal(t, exitCannotRun, exitErr.ExitCode())
	assert.Contains(t, string(out), "already in use")
	assert.NotContains(t, string(out), "second\n")

	require.NoError(t, first.Wait(), "the first run failed: %s", &firstErr)
	assert.Equal(t, "first\n", firstOut.String())
	assert.Equal(t, "first\n", e.outputLog(t, runID))
	e.requireNothingLeft(t, runID)
}

// TestFullRunsRootEndsTheRunAndRefusesTheNext puts the runs root on a small
// ext4 and fills it while the agent prints.
func TestFullRunsRootEndsTheRunAndRefusesTheNext(t *testing.T) {
	e := newCrashEnv(t)
	unmount, err := diskcap.Mount(context.Background(), e.root, 200<<20)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, unmount()) })
	runID := "full" + strings.ToLower(tenant(t)[:8])
	// 32m cap + 2 x 32m spools + records: admitted on an empty 200m root.
	limits := []string{"--disk", "32m", "--max-output", "32m"}
	agent := []string{"sh", "-c", `i=0; end=$(($(date +%s)+6)); while [ $(date +%s) -lt $end ]; do echo "line $i ................................................................................"; i=$((i+1)); done`}

	run := e.command(t, nil, e.runArgs(runID, limits, agent...)...)
	var runOut, runErr lockedbuf.Buffer
	run.Stdout, run.Stderr = &runOut, &runErr
	require.NoError(t, run.Start())
	spoolPath := filepath.Join(e.runDir(runID)+".executor", "stdout.log")
	require.Eventually(t, func() bool {
		fi, err := os.Stat(spoolPath)
		return err == nil && fi.Size() > 0
	}, 2*time.Minute, 20*time.Millisecond, "the run never started: %s", &runErr)
	filler := filepath.Join(e.root, "filler")
	fillUp(t, filler)

	err = run.Wait()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "the run must fail: %s", &runErr)
	assert.Contains(t, runErr.String(), "no space left on device", "the reason names the full disk")
	assert.Contains(t, runErr.String(), "is full")

	// Everything the spool accepted was stored, byte for byte.
	out := e.outputLog(t, runID)
	n := requireNumberedLines(t, strings.TrimSuffix(out, out[strings.LastIndexByte(out, '\n')+1:]))
	assert.Positive(t, n)
	assert.True(t, strings.HasPrefix(runOut.String(), out[:strings.LastIndexByte(out, '\n')+1]) || strings.HasPrefix(out, runOut.String()),
		"the live stdout and the stored log disagree")

	// The journal is valid, whatever it could write.
	jd, err := taskrun.OpenRunJournal(e.root)
	require.NoError(t, err)
	_, err = jd.List()
	require.NoError(t, err)

	next := e.command(t, nil, e.runArgs(runID+"n", limits, "echo", "next")...)
	nextOut, err := next.CombinedOutput()
	require.ErrorAs(t, err, &exitErr)
	assert.Equal(t, exitCannotRun, exitErr.ExitCode())
	assert.Regexp(t, `runs root \S+ has \S+ free, this run needs \S+`, string(nextOut))

	require.NoError(t, os.Remove(filler))
	// Space is back: gc finishes whatever the first run left, the next run works.
	gc := e.command(t, nil, "gc", "--root", e.root)
	gcOut, err := gc.CombinedOutput()
	require.NoError(t, err, "%s", gcOut)
	again := e.command(t, nil, e.runArgs(runID+"a", limits, "echo", "next")...)
	againOut, err := again.CombinedOutput()
	require.NoError(t, err, "%s", againOut)
	assert.Equal(t, "next\n", e.outputLog(t, runID+"a"))
	e.requireNothingLeft(t, runID)
	e.requireNothingLeft(t, runID+"a")
}

// fillUp writes to path until its filesystem is full, down to the last
// block (ext4 hands back reserved blocks after writeback, so it syncs and
// tries again with smaller writes).
func fillUp(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	for _, size := range []int{1 << 20, 64 << 10, 4 << 10, 4 << 10, 512, 512} {
		buf := make([]byte, size)
		for {
			if _, err := f.Write(buf); err != nil {
				require.ErrorIs(t, err, syscall.ENOSPC)
				break
			}
		}
		_ = f.Sync()
	}
}

// switchProxy forwards TCP connections to a target once set, and before
// that accepts them and never answers: a store that hangs.
type switchProxy struct {
	l      net.Listener
	mu     sync.Mutex
	target string
	conns  []net.Conn
}

func newSwitchProxy(t *testing.T) *switchProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &switchProxy{l: l}
	go p.serve()
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

func (p *switchProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		if target == "" {
			continue // hang: read nothing, answer nothing
		}
		go func() {
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				return
			}
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			_, _ = io.Copy(c, up)
			c.Close()
		}()
	}
}

func (p *switchProxy) forwardTo(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = addr
}

// TestHungStoreAndSIGTERMExitWithinTheGrace runs against an S3 store that
// hangs, sends SIGTERM and checks the executor exits within
// --shutdown-grace; once the store answers, `taskrun persist --all` stores
// everything.
func TestHungStoreAndSIGTERMExitWithinTheGrace(t *testing.T) {
	e := newCrashEnv(t)
	s3 := s3test.StartServer(t)
	proxy := newSwitchProxy(t)
	e.store = strings.Replace(s3.URL, s3.Addr, proxy.l.Addr().String(), 1)
	runID := "hang" + strings.ToLower(tenant(t)[:8])
	const grace = 6 * time.Second

	run := e.command(t, nil, e.runArgs(runID, []string{"--disk", "32m", "--shutdown-grace", grace.String()}, printer...)...)
	stdout, err := run.StdoutPipe()
	require.NoError(t, err)
	var runErr lockedbuf.Buffer
	run.Stderr = &runErr
	require.NoError(t, run.Start())
	t.Cleanup(func() { _ = run.Process.Kill(); _ = run.Wait() })
	lines := bufio.NewScanner(stdout)
	for i := 0; i < 10 && lines.Scan(); i++ {
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	require.NoError(t, run.Process.Signal(syscall.SIGTERM))
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	select {
	case <-exited:
	case <-time.After(grace + testdeadline.Scale(5*time.Second)): // the grace, and the time to exit after it
		t.Fatalf("the executor did not exit within --shutdown-grace %s: %s", grace, &runErr)
	}

	out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=dev.taskrun.run="+runID, "--filter", "status=running").Output()
	require.NoError(t, err)
	assert.Empty(t, strings.TrimSpace(string(out)), "the container still runs after the executor exited")
	mounts, err := os.ReadFile("/proc/mounts")
	require.NoError(t, err)
	assert.NotContains(t, string(mounts), e.root+"/", "a kept run holds no mount")
	jd, err := taskrun.OpenRunJournal(e.root)
	require.NoError(t, err)
	rec, err := jd.Load(runID)
	require.NoError(t, err, "the journal keeps the unfinished run: %s", &runErr)
	assert.NotEqual(t, journal.PhasePrepare, rec.Phase)

	dry := e.command(t, nil, "gc", "--dry-run", "--root", e.root)
	dryOut, err := dry.CombinedOutput()
	require.NoError(t, err, "%s", dryOut)
	assert.Regexp(t, `(kept|would recover) run `+runID, string(dryOut), "gc --dry-run lists the run and why")
	t.Logf("executor: %s\ngc --dry-run: %s", &runErr, dryOut)

	proxy.forwardTo(s3.Addr)
	persistCmd := e.command(t, nil, "persist", "--all", "--root", e.root)
	pout, err := persistCmd.CombinedOutput()
	require.NoError(t, err, "%s", pout)
	assert.Contains(t, string(pout), "0 run(s) still kept")
	n := requireNumberedLines(t, e.outputLog(t, runID))
	assert.GreaterOrEqual(t, n, 10)
	e.requireNothingLeft(t, runID)
}

// TestSecondSignalExitsAtOnce: with the store hung and a long grace, a
// second SIGTERM ends the executor at once; the journal stays whole and
// taskrun gc finishes the run once the store answers.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	e := newCrashEnv(t)
	s3 := s3test.StartServer(t)
	proxy := newSwitchProxy(t)
	e.store = strings.Replace(s3.URL, s3.Addr, proxy.l.Addr().String(), 1)
	runID := "sig2" + strings.ToLower(tenant(t)[:8])

	run := e.command(t, nil, e.runArgs(runID, []string{"--disk", "32m", "--shutdown-grace", "10m"}, printer...)...)
	stdout, err := run.StdoutPipe()
	require.NoError(t, err)
	var runErr lockedbuf.Buffer
	run.Stderr = &runErr
	require.NoError(t, run.Start())
	t.Cleanup(func() { _ = run.Process.Kill(); _ = run.Wait() })
	lines := bufio.NewScanner(stdout)
	for i := 0; i < 10 && lines.Scan(); i++ {
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	require.NoError(t, run.Process.Signal(syscall.SIGTERM))
	// The run stops its container and starts storing into the hung store.
	jd, err := taskrun.OpenRunJournal(e.root)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rec, err := jd.Load(runID)
		return err == nil && rec.Phase == journal.PhaseCollect
	}, time.Minute, 20*time.Millisecond, "the run never reached collect: %s", &runErr)
	require.NoError(t, run.Process.Signal(syscall.SIGTERM))
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	select {
	case err := <-exited:
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr)
		assert.Equal(t, exitInterrupted, exitErr.ExitCode())
	case <-time.After(time.Minute):
		t.Fatalf("a second signal did not end the executor: %s", &runErr)
	}
	assert.Contains(t, runErr.String(), "second signal")
	rec, err := jd.Load(runID)
	require.NoError(t, err, "the journal is whole")
	assert.Equal(t, journal.PhaseCollect, rec.Phase)

	proxy.forwardTo(s3.Addr)
	gc := e.command(t, nil, "gc", "--root", e.root)
	gcOut, err := gc.CombinedOutput()
	require.NoError(t, err, "%s", gcOut)
	assert.GreaterOrEqual(t, requireNumberedLines(t, e.outputLog(t, runID)), 10)
	e.requireNothingLeft(t, runID)
}

// An executor that died after storing everything and releasing the run's
// directory, while it sent the final report, leaves a record in the report
// phase: gc only sends the report owed, with the run's own verdict, and
// removes the record (it does not try to store the run again from a
// directory that is gone, nor keep it).
func TestRunKilledWhileReportingIsOnlyReported(t *testing.T) {
	e := newCrashEnv(t)
	const token = "crash-token"
	cp := controlplanetest.New(t, token)
	runID := "rep" + strings.ToLower(tenant(t)[:8])
	jd, err := taskrun.OpenRunJournal(e.root)
	require.NoError(t, err)
	gone, err := instance.Self()
	require.NoError(t, err)
	gone.ID = instance.NewID()
	dir := e.runDir(runID)
	entry, err := jd.Create(journal.Record{
		RunID: runID, UserID: e.user, ConversationID: defaultConversation, TaskID: "default", SessionID: "s1",
		Executor: gone, RunDir: dir, SpoolDir: dir + ".executor", Store: e.store,
		ControlPlane: &journal.ControlPlane{URL: cp.URL(), TokenEnv: envToken},
		Phase:        journal.PhaseReport, Status: model.StatusSucceeded,
		Pending: []journal.Pending{journal.PendingReport},
	})
	require.NoError(t, err)
	require.NoError(t, entry.Close()) // the executor died

	var gcOut, gcErr lockedbuf.Buffer
	gc := e.command(t, []string{envToken + "=" + token}, "gc", "--root", e.root)
	gc.Stdout, gc.Stderr = &gcOut, &gcErr
	require.NoError(t, gc.Run(), "gc: %s %s", &gcOut, &gcErr)
	assert.Contains(t, gcOut.String(), "recovered run "+runID)

	patches := cp.Patches(runID)
	require.NotEmpty(t, patches, "the owed report was sent")
	assert.Equal(t, model.StatusSucceeded, patches[len(patches)-1].Status, "with the run's own verdict")
	_, err = jd.Load(runID)
	require.ErrorIs(t, err, journal.ErrNotFound, "no record is left: %s", &gcOut)
	assert.NoDirExists(t, dir)
}

// awaitJournalEnd waits for the run's journal record to be removed: the
// executor's last step of a run, after its container is gone and its
// host released it (the disk cap's unmount, the run directory's removal),
// and after its index record ended, which is what the tests wait on
// first. It returns at once when the record is gone already, and at its
// bound when the record stays (a run kept for recovery): the checks that
// follow then say what is left.
//
// Between the index record's end and the removal the executor only sends
// the final report (no control plane in these tests) and removes the
// record: file writes. The bound is a minute on an idle machine, scaled
// by the load, for a wait that normally lasts milliseconds.
func (e *crashEnv) awaitJournalEnd(t *testing.T, runID string) {
	t.Helper()
	jd, err := taskrun.OpenRunJournal(e.root)
	require.NoError(t, err)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	require.NoError(t, err)
	defer unix.Close(fd)
	// The watch is in place before the record is looked at, so its
	// removal cannot slip between the two.
	_, err = unix.InotifyAddWatch(fd, jd.Path(), unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_DELETE_SELF)
	require.NoError(t, err)
	gone := func() bool {
		_, err := jd.Load(runID)
		return errors.Is(err, journal.ErrNotFound)
	}
	deadline := time.Now().Add(testdeadline.Scale(time.Minute))
	buf := make([]byte, 64<<10)
	for !gone() {
		left := time.Until(deadline)
		if left <= 0 {
			t.Logf("run %s: its journal record is still there after %s", runID, testdeadline.Scale(time.Minute))
			return
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, int(left.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			require.NoError(t, err)
		}
		// Drain the events: any removal in the directory is a reason to
		// look again.
		for {
			if _, err := unix.Read(fd, buf); err != nil {
				break
			}
		}
	}
}
