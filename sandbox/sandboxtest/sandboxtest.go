// Package sandboxtest is the conformance suite every sandbox.Backend passes.
//
// A backend's tests call Run with a Harness, as go-cloud's drivertest and
// Nomad's DriverHarness do: the harness makes backends, turns each case's
// Workload into a command the backend runs, and declares the backend's
// Capabilities. A case that needs a capability the backend does not declare
// is skipped, and says which. Every case labels its containers with a unique
// value and checks that nothing carrying it is left behind, so the suite can
// run next to other users of the same engine.
package sandboxtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// DefaultImage is the image Docker-like harnesses run. It needs a POSIX sh
// with dd, yes, head, tail, sleep, cat, touch, id, uname and dmesg (busybox
// has them all).
const DefaultImage = "taskrun/testbox:local"

// LabelCase is the label whose unique value marks one case's containers.
const LabelCase = "dev.taskrun.sandboxtest.case"

// caseTimeout bounds every case so a hang fails instead of stalling the run.
const caseTimeout = 3 * time.Minute

// Harness adapts the suite to one backend.
type Harness interface {
	// NewBackend returns a backend for one case.
	NewBackend(t *testing.T) sandbox.Backend
	// Capabilities declares what the backend can do beyond the portable
	// contract.
	Capabilities() Capabilities
	// Prepare adapts every Spec and Policy the suite starts: the image, the
	// runtime, the harness's own labels.
	Prepare(spec *sandbox.Spec, policy *sandbox.Policy)
	// Command returns the command that makes b's container run w.
	Command(t *testing.T, b sandbox.Backend, w Workload) []string
	// BreakStart changes spec so that b fails to start its container after
	// validating it (for Docker: after creating it).
	BreakStart(t *testing.T, b sandbox.Backend, spec *sandbox.Spec)
	// Leftovers lists the IDs of containers, in any state, carrying all
	// labels. Every case checks that it leaves nothing behind.
	Leftovers(ctx context.Context, labels map[string]string) ([]string, error)
}

// Capabilities are what a backend declares beyond the portable contract
// (start, streams, exit codes, timeouts, cancellation, bind mounts, clean
// failure, concurrency).
type Capabilities struct {
	// Confinement: a kernel confines the process as the Policy says (no
	// capabilities, no-new-privileges, seccomp, read-only root, non-root
	// user, loopback-only network, ulimits, pids limit), visible from inside.
	Confinement bool
	// OOM: the memory limit is enforced and an OOM kill is reported.
	OOM bool
	// Runtimes: Policy.Runtime selects the kernel the process sees
	// ("runsc": gVisor's).
	Runtimes bool
	// LagTolerant: a reader that lags far behind the container still gets
	// every byte of its output after the container exited.
	LagTolerant bool
	// Reaper, when non-nil, plants orphans and runs the backend's reaper.
	Reaper Reaper
	// Gaps says, for a capability the backend lacks, why; the cases that
	// need it print the reason when they skip. Keys are the capabilities'
	// field names ("Confinement", "OOM", "Runtimes", "LagTolerant", "Reaper").
	Gaps map[string]string
}

// Reaper is the part of a harness that exercises a backend's reaper.
type Reaper interface {
	// Orphan creates and starts, behind the backend's back, a long-running
	// container as an executor killed mid-run leaves it: managed, carrying
	// labels, created long ago and past its expiry.
	Orphan(ctx context.Context, labels map[string]string) (string, error)
	// Reap runs b's reaper restricted to labels, with a grace period short
	// enough that a container started just now is eligible unless a live run
	// owns it.
	Reap(ctx context.Context, b sandbox.Backend, labels map[string]string) error
}

// Workload is what a case runs, in both of the forms backends run: a POSIX
// sh script for backends that run processes from an image, and a Go
// Program for sandboxfake. Both must behave the same. Cases that need a
// capability may give only the Script.
type Workload struct {
	Script  string
	Program sandboxfake.Program
}

// ShellCommand is the command that runs w.Script with the image's sh.
func ShellCommand(w Workload) []string { return []string{"sh", "-c", w.Script} }

// suite carries the harness through the cases.
type suite struct {
	h    Harness
	caps Capabilities
}

// Run runs every conformance case as a subtest of t.
func Run(t *testing.T, h Harness) {
	s := &suite{h: h, caps: h.Capabilities()}
	cases := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"ExitCodes", s.testExitCodes},
		{"StdoutStderrSeparate", s.testStdoutStderrSeparate},
		{"LargeStdoutByteExact", s.testLargeStdout},
		{"FinalPartialLine", s.testFinalPartialLine},
		{"SlowConsumer", s.testSlowConsumer},
		{"OOMKilled", s.testOOMKilled},
		{"TimeoutIgnoringSIGTERM", s.testTimeoutIgnoringSIGTERM},
		{"CancelMidRun", s.testCancelMidRun},
		{"KillNowMidRun", s.testKillNowMidRun},
		{"Concurrent", s.testConcurrent},
		{"Confinement", s.testConfinement},
		{"PidsLimit", s.testPidsLimit},
		{"BindMounts", s.testBindMounts},
		{"Runtime", s.testRuntime},
		{"StartFailureLeavesNothing", s.testStartFailure},
		{"CloseWithoutWait", s.testCloseWithoutWait},
		{"CreateAhead", s.testCreateAhead},
		{"Reaper", s.testReaper},
		{"StatedCapabilities", s.testStatedCapabilities},
	}
	for _, c := range cases {
		t.Run(c.name, c.fn)
	}
}

// needs skips t unless the backend declared the capability, with the
// backend's reason when it gave one.
func (s *suite) needs(t *testing.T, declared bool, capability, what string) {
	t.Helper()
	if declared {
		return
	}
	if why := s.caps.Gaps[capability]; why != "" {
		t.Skipf("backend does not declare %s: %s", what, why)
	}
	t.Skipf("backend does not declare %s", what)
}

// run is one container of a case.
type run struct {
	spec   sandbox.Spec
	policy sandbox.Policy
	stdout io.Writer
	stderr io.Writer
}

// newRun returns a run of w on b under the default policy with the case's
// labels.
func (s *suite) newRun(t *testing.T, b sandbox.Backend, labels map[string]string, w Workload) *run {
	t.Helper()
	r := &run{
		spec: sandbox.Spec{
			Cmd:       s.h.Command(t, b, w),
			Labels:    labels,
			Run:       model.RunRef{UserID: "sandboxtest", ConversationID: "sandboxtest", TaskID: "conformance", RunID: labels[LabelCase]},
			Timeout:   2 * time.Minute,
			StopGrace: time.Second,
		},
		policy: sandbox.DefaultPolicy(),
	}
	r.policy.MemoryBytes = 256 << 20
	s.h.Prepare(&r.spec, &r.policy)
	return r
}

// caseLabels returns a unique case label.
func (s *suite) caseLabels(t *testing.T) map[string]string {
	t.Helper()
	return map[string]string{LabelCase: randomHex(t)}
}

// caseContext is t's context bounded by caseTimeout.
func caseContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), caseTimeout)
	t.Cleanup(cancel)
	return ctx
}

// execute starts r on b, waits for it, closes it and returns the result.
func (s *suite) execute(ctx context.Context, t *testing.T, b sandbox.Backend, r *run) sandbox.Result {
	t.Helper()
	h, err := b.Start(ctx, r.spec, r.policy, sandbox.Streams{Stdout: r.stdout, Stderr: r.stderr})
	require.NoError(t, err)
	res := h.Wait(ctx)
	require.NoError(t, h.Close(ctx))
	return res
}

// requireNoLeftovers fails when any container carries labels.
func (s *suite) requireNoLeftovers(t *testing.T, labels map[string]string) {
	t.Helper()
	ids, err := s.h.Leftovers(context.Background(), labels)
	require.NoError(t, err)
	require.Empty(t, ids, "containers left behind")
}

// capture runs w and returns its result, stdout and stderr.
func (s *suite) capture(t *testing.T, w Workload, tweak func(*run)) (sandbox.Result, string, string) {
	t.Helper()
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	var out, errOut lockedbuf.Buffer
	b := s.h.NewBackend(t)
	r := s.newRun(t, b, labels, w)
	r.stdout, r.stderr = &out, &errOut
	if tweak != nil {
		tweak(r)
	}
	res := s.execute(ctx, t, b, r)
	s.requireNoLeftovers(t, labels)
	return res, out.String(), errOut.String()
}

// writeAndExit is a Program that writes out and errOut, then exits with code.
func writeAndExit(out, errOut string, code int) sandboxfake.Program {
	return func(_ context.Context, p *sandboxfake.Process) int {
		_, _ = io.WriteString(p.Stdout, out)
		_, _ = io.WriteString(p.Stderr, errOut)
		return code
	}
}

// sleep is a Program that runs until it is stopped or killed, as
// `sleep 1000` does.
func sleep(ctx context.Context, p *sandboxfake.Process) int {
	select {
	case <-p.Terminated():
		return 143
	case <-ctx.Done():
		return sandboxfake.KilledExitCode
	}
}

func (s *suite) testExitCodes(t *testing.T) {
	for _, code := range []int{0, 1, 4} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			res, _, _ := s.capture(t, Workload{Script: fmt.Sprintf("exit %d", code), Program: writeAndExit("", "", code)}, nil)
			require.NoError(t, res.Err)
			assert.Equal(t, code, res.ExitCode)
			assert.Equal(t, code == 0, res.Succeeded())
			assert.False(t, res.TimedOut)
			assert.False(t, res.Cancelled)
			assert.False(t, res.OOMKilled)
			assert.False(t, res.StartedAt.IsZero())
			assert.False(t, res.FinishedAt.Before(res.StartedAt))
		})
	}
}

func (s *suite) testStdoutStderrSeparate(t *testing.T) {
	w := Workload{
		Script: "echo out1; echo err1 >&2; echo out2; echo err2 >&2",
		Program: func(_ context.Context, p *sandboxfake.Process) int {
			for _, l := range []string{"1", "2"} {
				_, _ = io.WriteString(p.Stdout, "out"+l+"\n")
				_, _ = io.WriteString(p.Stderr, "err"+l+"\n")
			}
			return 0
		},
	}
	res, out, errOut := s.capture(t, w, nil)
	require.NoError(t, res.Err)
	assert.Equal(t, "out1\nout2\n", out)
	assert.Equal(t, "err1\nerr2\n", errOut)
}

func (s *suite) testLargeStdout(t *testing.T) {
	const size = 100 << 20
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	got := sha256.New()
	counted := &countingWriter{w: got}
	b := s.h.NewBackend(t)
	r := s.newRun(t, b, labels, Workload{
		Script: "dd if=/dev/zero bs=1048576 count=100 2>/dev/null",
		Program: func(_ context.Context, p *sandboxfake.Process) int {
			chunk := make([]byte, 1<<20)
			for range size / len(chunk) {
				if _, err := p.Stdout.Write(chunk); err != nil {
					return 1
				}
			}
			return 0
		},
	})
	r.stdout = counted
	res := s.execute(ctx, t, b, r)
	require.NoError(t, res.Err)
	require.Equal(t, 0, res.ExitCode)
	want := sha256.Sum256(make([]byte, size))
	assert.Equal(t, int64(size), counted.n)
	assert.Equal(t, hex.EncodeToString(want[:]), hex.EncodeToString(got.Sum(nil)))
	s.requireNoLeftovers(t, labels)
}

func (s *suite) testFinalPartialLine(t *testing.T) {
	w := Workload{
		Script:  "printf 'first\\nlast line without newline'; printf 'err tail' >&2; exit 2",
		Program: writeAndExit("first\nlast line without newline", "err tail", 2),
	}
	res, out, errOut := s.capture(t, w, nil)
	require.NoError(t, res.Err)
	assert.Equal(t, 2, res.ExitCode)
	assert.Equal(t, "first\nlast line without newline", out)
	assert.Equal(t, "err tail", errOut)
}

// testSlowConsumer spools stdout to a file through a writer that sleeps on
// every write, while the consumer of the spool reads nothing until the run is
// over: the container must still finish and every byte must arrive.
func (s *suite) testSlowConsumer(t *testing.T) {
	s.needs(t, s.caps.LagTolerant, "LagTolerant", "a complete output for a reader that lags behind")
	const size = 8 << 20
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	spoolPath := filepath.Join(t.TempDir(), "stdout.spool")
	f, err := os.Create(spoolPath)
	require.NoError(t, err)
	defer f.Close()
	b := s.h.NewBackend(t)
	r := s.newRun(t, b, labels, Workload{
		Script: fmt.Sprintf("yes taskrun | head -c %d; printf tail", size),
		Program: func(_ context.Context, p *sandboxfake.Process) int {
			chunk := bytes.Repeat([]byte("taskrun\n"), 8<<10)
			for range size / len(chunk) {
				if _, err := p.Stdout.Write(chunk); err != nil {
					return 1
				}
			}
			_, _ = io.WriteString(p.Stdout, "tail")
			return 0
		},
	})
	r.stdout = &sleepyWriter{w: f, delay: time.Millisecond}

	consumerMayRead := make(chan struct{})
	consumed := make(chan []byte, 1)
	go func() {
		<-consumerMayRead
		consumed <- slowReadAll(spoolPath, size+4)
	}()
	res := s.execute(ctx, t, b, r)
	close(consumerMayRead)
	require.NoError(t, res.Err)
	require.Equal(t, 0, res.ExitCode)
	got := <-consumed
	want := append(bytes.Repeat([]byte("taskrun\n"), size/8), "tail"...)
	require.Equal(t, len(want), len(got))
	assert.True(t, bytes.Equal(want, got), "spooled output differs from what the container wrote")
	s.requireNoLeftovers(t, labels)
}

func (s *suite) testOOMKilled(t *testing.T) {
	s.needs(t, s.caps.OOM, "OOM", "OOM kills")
	// The hog starts after a second: on cgroup v1 the engine watches the
	// container's memory cgroup for OOM events only once the container has
	// started, and so does the backend's own watch (sandbox/docker/oom.go),
	// so a kill within the first milliseconds is seen by neither on a loaded
	// host. An agent's OOM comes later than that.
	res, _, _ := s.capture(t, Workload{Script: "sleep 1; tail /dev/zero"}, func(r *run) {
		r.policy.MemoryBytes = 32 << 20
	})
	require.NoError(t, res.Err)
	assert.True(t, res.OOMKilled, "memory hog over the limit not reported as OOM-killed (exit %d)", res.ExitCode)
	assert.NotEqual(t, 0, res.ExitCode)
	assert.False(t, res.Succeeded())
	assert.False(t, res.TimedOut)
}

// testTimeoutIgnoringSIGTERM runs a shell that ignores SIGTERM. With Init the
// init process forwards SIGTERM to the shell only, which ignores it, so only
// the SIGKILL after the grace period ends the run.
func (s *suite) testTimeoutIgnoringSIGTERM(t *testing.T) {
	w := Workload{
		Script: `trap "" TERM; echo started; sleep 1000 & wait; echo survived`,
		Program: func(ctx context.Context, p *sandboxfake.Process) int {
			_, _ = io.WriteString(p.Stdout, "started\n")
			<-ctx.Done() // SIGTERM ignored: only SIGKILL ends it
			_, _ = io.WriteString(p.Stdout, "survived\n")
			return 0
		},
	}
	res, out, _ := s.capture(t, w, func(r *run) {
		r.spec.Timeout = 2 * time.Second
		r.spec.StopGrace = time.Second
	})
	require.NoError(t, res.Err)
	assert.True(t, res.TimedOut)
	assert.False(t, res.Cancelled)
	assert.Equal(t, 137, res.ExitCode, "expected death by SIGKILL")
	assert.Equal(t, "started\n", out)
}

func (s *suite) testCancelMidRun(t *testing.T) {
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ready lockedbuf.Buffer
	b := s.h.NewBackend(t)
	r := s.newRun(t, b, labels, Workload{
		Script: `trap 'echo bye; exit 0' TERM; echo ready; sleep 1000 & wait`,
		Program: func(ctx context.Context, p *sandboxfake.Process) int {
			_, _ = io.WriteString(p.Stdout, "ready\n")
			select {
			case <-p.Terminated():
				_, _ = io.WriteString(p.Stdout, "bye\n")
				return 0
			case <-ctx.Done():
				return sandboxfake.KilledExitCode
			}
		},
	})
	h, err := b.Start(runCtx, r.spec, r.policy, sandbox.Streams{Stdout: &ready})
	require.NoError(t, err)
	select {
	case <-ready.Seen("ready"):
	case <-ctx.Done():
		t.Fatal("container never printed its ready marker")
	}
	cancel()
	res := h.Wait(runCtx)
	require.NoError(t, res.Err)
	assert.True(t, res.Cancelled)
	assert.False(t, res.TimedOut)
	assert.False(t, res.Succeeded())
	assert.Equal(t, "ready\nbye\n", ready.String(), "output written while stopping was lost")
	require.NoError(t, h.Close(runCtx), "Close must work with the run's cancelled context")
	s.requireNoLeftovers(t, labels)
}

// testKillNowMidRun cancels with a sandbox.KillNow cause: the container is
// killed at once, so its SIGTERM trap never runs.
func (s *suite) testKillNowMidRun(t *testing.T) {
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var ready lockedbuf.Buffer
	b := s.h.NewBackend(t)
	r := s.newRun(t, b, labels, Workload{
		Script: `trap 'echo bye; exit 0' TERM; echo ready; sleep 1000 & wait`,
		Program: func(ctx context.Context, p *sandboxfake.Process) int {
			_, _ = io.WriteString(p.Stdout, "ready\n")
			select {
			case <-p.Terminated():
				_, _ = io.WriteString(p.Stdout, "bye\n")
				return 0
			case <-ctx.Done():
				return sandboxfake.KilledExitCode
			}
		},
	})
	h, err := b.Start(runCtx, r.spec, r.policy, sandbox.Streams{Stdout: &ready})
	require.NoError(t, err)
	select {
	case <-ready.Seen("ready"):
	case <-ctx.Done():
		t.Fatal("container never printed its ready marker")
	}
	lost := errors.New("lease lost")
	cancel(sandbox.KillNow(lost))
	require.ErrorIs(t, context.Cause(runCtx), lost, "the cause still names why")
	res := h.Wait(runCtx)
	require.NoError(t, res.Err)
	assert.True(t, res.Cancelled)
	assert.Equal(t, 137, res.ExitCode, "killed by SIGKILL, not stopped")
	assert.Equal(t, "ready\n", ready.String(), "the SIGTERM trap ran: the container was stopped with a grace, not killed")
	require.NoError(t, h.Close(runCtx))
	s.requireNoLeftovers(t, labels)
}

func (s *suite) testConcurrent(t *testing.T) {
	const n = 8
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	b := s.h.NewBackend(t)
	var wg sync.WaitGroup
	results := make([]sandbox.Result, n)
	outs := make([]lockedbuf.Buffer, n)
	errs := make([]error, n)
	runs := make([]*run, n)
	for i := range n {
		runs[i] = s.newRun(t, b, labels, Workload{
			Script:  fmt.Sprintf("echo run %d; exit %d", i, i%3),
			Program: writeAndExit(fmt.Sprintf("run %d\n", i), "", i%3),
		})
	}
	for i := range n {
		wg.Go(func() {
			r := runs[i]
			h, err := b.Start(ctx, r.spec, r.policy, sandbox.Streams{Stdout: &outs[i]})
			if err != nil {
				errs[i] = err
				return
			}
			results[i] = h.Wait(ctx)
			errs[i] = h.Close(ctx)
		})
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "run %d", i)
		require.NoError(t, results[i].Err, "run %d", i)
		assert.Equal(t, i%3, results[i].ExitCode, "run %d", i)
		assert.Equal(t, fmt.Sprintf("run %d\n", i), outs[i].String())
	}
	s.requireNoLeftovers(t, labels)
}

// testConfinement checks from inside that the default policy holds: no
// capabilities, no-new-privileges, non-root, read-only root, writable /tmp,
// only loopback networking, and the ulimits.
func (s *suite) testConfinement(t *testing.T) {
	s.needs(t, s.caps.Confinement, "Confinement", "kernel confinement")
	script := strings.Join([]string{
		`grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status | tr -s '\t ' ' '`,
		`echo "uid=$(id -u) gid=$(id -g)"`,
		`touch /rootfs-write 2>/dev/null && echo rootfs=writable || echo rootfs=readonly`,
		`echo x > /tmp/probe && echo tmp=writable || echo tmp=readonly`,
		`echo "nofile=$(ulimit -n) core=$(ulimit -c)"`,
		`echo "ifaces=$(ls /sys/class/net | tr '\n' ' ')"`,
		`echo "tmpmount=$(grep ' /tmp ' /proc/mounts | cut -d' ' -f4)"`,
		`cp /bin/sh /tmp/sh && /tmp/sh -c 'echo tmp=exec'`,
		`grep '^Seccomp:' /proc/self/status | tr -s '\t ' ' '`,
	}, "; ")
	var runtime string
	res, out, _ := s.capture(t, Workload{Script: script}, func(r *run) { runtime = r.policy.Runtime })
	require.NoError(t, res.Err)
	require.Equal(t, 0, res.ExitCode)
	assert.Contains(t, out, "CapEff: 0000000000000000\n")
	assert.Contains(t, out, "CapBnd: 0000000000000000\n")
	if runtime != sandbox.RuntimeGVisor {
		// gVisor's /proc/self/status has no NoNewPrivs line.
		assert.Contains(t, out, "NoNewPrivs: 1\n")
	}
	assert.Contains(t, out, "uid=10001 gid=10001\n")
	assert.Contains(t, out, "rootfs=readonly\n")
	assert.Contains(t, out, "tmp=writable\n")
	assert.Contains(t, out, fmt.Sprintf("nofile=%d core=0\n", sandbox.DefaultNoFile))
	assert.Contains(t, out, "ifaces=lo \n")
	assert.Contains(t, out, "tmp=exec\n", "/tmp must allow exec (see the docker backend's TmpfsPath)")
	if runtime != sandbox.RuntimeGVisor {
		// gVisor neither shows nosuid/nodev in /proc/mounts nor filters
		// syscalls with seccomp inside the sandbox; it implements both itself.
		assert.Regexp(t, `tmpmount=\S*nosuid`, out)
		assert.Regexp(t, `tmpmount=\S*nodev`, out)
		assert.Contains(t, out, "Seccomp: 2\n", "default seccomp profile not applied")
	}
}

// testPidsLimit forks more processes than the limit allows: the shell must
// fail to fork before it gets through them all.
func (s *suite) testPidsLimit(t *testing.T) {
	s.needs(t, s.caps.Confinement, "Confinement", "kernel confinement (pids limit)")
	const attempts = 100
	w := Workload{Script: fmt.Sprintf("for i in $(seq %d); do sleep 30 & echo $i; done; echo all", attempts)}
	res, out, _ := s.capture(t, w, func(r *run) {
		r.policy.PidsLimit = 64
	})
	require.NoError(t, res.Err)
	assert.NotContains(t, out, "all\n", "forked %d processes under a limit of 64", attempts)
	assert.NotEqual(t, 0, res.ExitCode)
}

func (s *suite) testBindMounts(t *testing.T) {
	rw := worldWritableDir(t)
	ro := worldWritableDir(t)
	require.NoError(t, os.WriteFile(filepath.Join(ro, "given"), []byte("from host"), 0o644))
	w := Workload{
		Script: `echo from-container > /rw/made && cat /ro/given && (echo x > /ro/nope 2>/dev/null && echo ro=writable || echo ro=readonly)`,
		Program: func(_ context.Context, p *sandboxfake.Process) int {
			if err := p.WriteFile("/rw/made", []byte("from-container\n")); err != nil {
				return 1
			}
			given, err := p.ReadFile("/ro/given")
			if err != nil {
				return 1
			}
			_, _ = p.Stdout.Write(given)
			if p.WriteFile("/ro/nope", []byte("x\n")) == nil {
				_, _ = io.WriteString(p.Stdout, "ro=writable\n")
			} else {
				_, _ = io.WriteString(p.Stdout, "ro=readonly\n")
			}
			return 0
		},
	}
	res, out, _ := s.capture(t, w, func(r *run) {
		r.spec.Mounts = []sandbox.Mount{
			{Source: rw, Target: "/rw"},
			{Source: ro, Target: "/ro", ReadOnly: true},
		}
	})
	require.NoError(t, res.Err)
	require.Equal(t, 0, res.ExitCode)
	assert.Equal(t, "from hostro=readonly\n", out)
	made, err := os.ReadFile(filepath.Join(rw, "made"))
	require.NoError(t, err)
	assert.Equal(t, "from-container\n", string(made))
	assert.NoFileExists(t, filepath.Join(ro, "nope"))
}

// testRuntime checks from inside which kernel the process sees: gVisor
// reports release 4.4.0 and says so in dmesg; runc shows the host's kernel.
func (s *suite) testRuntime(t *testing.T) {
	s.needs(t, s.caps.Runtimes, "Runtimes", "runtimes")
	var runtime string
	res, out, _ := s.capture(t, Workload{Script: "uname -r; dmesg 2>/dev/null | head -n 3"}, func(r *run) { runtime = r.policy.Runtime })
	require.NoError(t, res.Err)
	lines := strings.SplitN(out, "\n", 2)
	if runtime == sandbox.RuntimeGVisor {
		assert.Equal(t, "4.4.0", lines[0])
		assert.Contains(t, out, "gVisor")
		return
	}
	assert.NotEqual(t, "4.4.0", lines[0])
	assert.NotContains(t, out, "gVisor")
}

// testStartFailure makes Start fail after the container was validated (for
// Docker: created) and with a cancelled context, and checks nothing is left
// behind either way.
func (s *suite) testStartFailure(t *testing.T) {
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	b := s.h.NewBackend(t)
	w := Workload{Script: "true", Program: writeAndExit("", "", 0)}
	r := s.newRun(t, b, labels, w)
	s.h.BreakStart(t, b, &r.spec)
	_, err := b.Start(ctx, r.spec, r.policy, sandbox.Streams{})
	require.Error(t, err)
	s.requireNoLeftovers(t, labels)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.Start(cancelled, s.newRun(t, b, labels, w).spec, r.policy, sandbox.Streams{})
	require.ErrorIs(t, err, context.Canceled)
	s.requireNoLeftovers(t, labels)
}

// testCloseWithoutWait closes a running handle, as a caller that failed
// elsewhere does, and checks the container is gone and Close is idempotent.
func (s *suite) testCloseWithoutWait(t *testing.T) {
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	b := s.h.NewBackend(t)
	r := s.newRun(t, b, labels, Workload{Script: "sleep 1000", Program: sleep})
	h, err := b.Start(ctx, r.spec, r.policy, sandbox.Streams{})
	require.NoError(t, err)
	require.NoError(t, h.Close(ctx))
	require.NoError(t, h.Close(ctx))
	s.requireNoLeftovers(t, labels)
}

// testCreateAhead checks a sandbox.Creator: a container created ahead sees
// what its bind-mount source holds when it starts, not when it was created
// (the executor fills the run directory meanwhile); one discarded instead
// leaves nothing.
func (s *suite) testCreateAhead(t *testing.T) {
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	b := s.h.NewBackend(t)
	c, ok := b.(sandbox.Creator)
	if !ok {
		t.Skip("the backend creates containers only as it starts them (no sandbox.Creator)")
	}
	dir := worldWritableDir(t)
	var out lockedbuf.Buffer
	r := s.newRun(t, b, labels, Workload{
		Script: "cat /in/late",
		Program: func(_ context.Context, p *sandboxfake.Process) int {
			data, err := p.ReadFile("/in/late")
			if err != nil {
				return 1
			}
			_, _ = p.Stdout.Write(data)
			return 0
		},
	})
	r.spec.Mounts = []sandbox.Mount{{Source: dir, Target: "/in", ReadOnly: true}}
	created, err := c.Create(ctx, r.spec, r.policy)
	require.NoError(t, err)
	require.NotEmpty(t, created.ID())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "late"), []byte("written after create"), 0o644))
	h, err := created.Start(ctx, sandbox.Streams{Stdout: &out, Stderr: io.Discard})
	require.NoError(t, err)
	res := h.Wait(ctx)
	require.NoError(t, h.Close(ctx))
	require.NoError(t, res.Err)
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, "written after create", out.String())

	discarded, err := c.Create(ctx, r.spec, r.policy)
	require.NoError(t, err)
	require.NoError(t, discarded.Discard(ctx))
	s.requireNoLeftovers(t, labels)
}

// testReaper plants an orphan as a killed executor leaves it and checks the
// reaper removes it while sparing a live run of the same backend.
func (s *suite) testReaper(t *testing.T) {
	reaper := s.caps.Reaper
	s.needs(t, reaper != nil, "Reaper", "a reaper")
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	b := s.h.NewBackend(t)
	orphan, err := reaper.Orphan(ctx, labels)
	require.NoError(t, err)
	r := s.newRun(t, b, labels, Workload{Script: "sleep 1000", Program: sleep})
	live, err := b.Start(ctx, r.spec, r.policy, sandbox.Streams{})
	require.NoError(t, err)
	defer live.Close(context.Background())

	require.NoError(t, reaper.Reap(ctx, b, labels))
	left, err := s.h.Leftovers(ctx, labels)
	require.NoError(t, err)
	assert.NotContains(t, left, orphan, "orphan survived the reaper")
	assert.Contains(t, left, live.ID(), "reaper removed a live run's container")

	require.NoError(t, live.Close(ctx))
	s.requireNoLeftovers(t, labels)
}

// randomHex returns 16 random hex digits.
func randomHex(t *testing.T) string {
	t.Helper()
	var p [8]byte
	_, err := rand.Read(p[:])
	require.NoError(t, err)
	return hex.EncodeToString(p[:])
}

// worldWritableDir is a temp dir the container's non-root user can write.
func worldWritableDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o777))
	return dir
}

// slowReadAll reads the file at path in small chunks with pauses until want
// bytes arrived or reading fails.
func slowReadAll(path string, want int) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out bytes.Buffer
	buf := make([]byte, 1<<20)
	for out.Len() < want {
		n, err := f.Read(buf)
		out.Write(buf[:n])
		if errors.Is(err, io.EOF) && n == 0 || err != nil && !errors.Is(err, io.EOF) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return out.Bytes()
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

// Write implements io.Writer.
func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// sleepyWriter is a spool that is slow to accept each write.
type sleepyWriter struct {
	w     io.Writer
	delay time.Duration
}

// Write implements io.Writer.
func (s *sleepyWriter) Write(p []byte) (int, error) {
	time.Sleep(s.delay)
	return s.w.Write(p)
}

// testStatedCapabilities checks that the backend states its capabilities
// (sandbox.Capable) and that they say what it implements: the orchestrator
// reads the statement and never looks at the backend's type.
func (s *suite) testStatedCapabilities(t *testing.T) {
	b := s.h.NewBackend(t)
	c, ok := b.(sandbox.Capable)
	require.True(t, ok, "the backend states its capabilities (sandbox.Capable)")
	caps := c.Capabilities()
	assert.Contains(t, []string{sandbox.BackendDocker, sandbox.BackendKubernetes}, caps.Kind)
	_, creates := b.(sandbox.Creator)
	_, describes := b.(sandbox.EngineDescriber)
	_, resolves := b.(sandbox.ImageResolver)
	_, checks := b.(sandbox.ImageChecker)
	assert.Equal(t, creates, caps.CreatesAhead, "CreatesAhead says whether it is a sandbox.Creator")
	assert.Equal(t, describes, caps.DescribesHost, "DescribesHost says whether it is a sandbox.EngineDescriber")
	assert.Equal(t, resolves, caps.ResolvesImages, "ResolvesImages says whether it is a sandbox.ImageResolver")
	assert.Equal(t, checks, caps.ChecksImages, "ChecksImages says whether it is a sandbox.ImageChecker")
	assert.Equal(t, caps, sandbox.CapabilitiesOf(b))
}
