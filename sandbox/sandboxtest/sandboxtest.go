// Package sandboxtest is the conformance suite every sandbox.Backend passes.
//
// A backend's own tests call Run with a constructor and the few hooks the suite
// cannot express through sandbox.Backend (listing leftovers, planting an orphan
// as a killed executor would leave it, running the reaper). Every case labels
// its containers with a unique value and checks that nothing carrying it is
// left behind, so the suite can run next to other users of the same engine.
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
)

// DefaultImage is the image the suite runs unless Options.Image is set. It
// needs a POSIX sh with dd, yes, head, tail, sleep, cat, touch, id, uname and
// dmesg (busybox has them all).
const DefaultImage = "taskrun/testbox:local"

// LabelCase is the label whose unique value marks one case's containers.
const LabelCase = "dev.taskrun.sandboxtest.case"

// caseTimeout bounds every case so a hang fails instead of stalling the run.
const caseTimeout = 3 * time.Minute

// Options adapt the suite to a backend.
type Options struct {
	// Image is the test image; DefaultImage when empty.
	Image string
	// Runtime is set as Policy.Runtime on every run ("" or "runsc").
	Runtime string
	// Labels are added to every Spec.
	Labels map[string]string
	// Leftovers lists the IDs of containers, in any state, carrying all labels.
	// It is required: every case checks that it leaves nothing behind.
	Leftovers func(ctx context.Context, labels map[string]string) ([]string, error)
	// Orphan creates and starts, behind the backend's back, a long-running
	// container as an executor killed mid-run leaves it: managed, carrying
	// labels, created long ago and past its expiry. Nil skips the reaper case.
	Orphan func(ctx context.Context, labels map[string]string) (string, error)
	// Reap runs b's reaper restricted to labels, with a grace period short
	// enough that a container started just now is eligible unless a live run
	// owns it. Nil skips the reaper case.
	Reap func(ctx context.Context, b sandbox.Backend, labels map[string]string) error
}

// suite carries the options and the constructor through the cases.
type suite struct {
	opts       Options
	newBackend func(t *testing.T) sandbox.Backend
}

// Run runs every conformance case as a subtest of t.
func Run(t *testing.T, newBackend func(t *testing.T) sandbox.Backend, opts Options) {
	require.NotNil(t, opts.Leftovers, "sandboxtest: Options.Leftovers is required")
	if opts.Image == "" {
		opts.Image = DefaultImage
	}
	s := &suite{opts: opts, newBackend: newBackend}
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
		{"Concurrent", s.testConcurrent},
		{"Confinement", s.testConfinement},
		{"PidsLimit", s.testPidsLimit},
		{"BindMounts", s.testBindMounts},
		{"Runtime", s.testRuntime},
		{"StartFailureLeavesNothing", s.testStartFailure},
		{"CloseWithoutWait", s.testCloseWithoutWait},
		{"Reaper", s.testReaper},
	}
	for _, c := range cases {
		t.Run(c.name, c.fn)
	}
}

// run is one container of a case.
type run struct {
	spec   sandbox.Spec
	policy sandbox.Policy
	stdout io.Writer
	stderr io.Writer
}

// newRun returns a run of cmd (via sh -c) under the default policy with the
// case's labels.
func (s *suite) newRun(labels map[string]string, script string) *run {
	pol := sandbox.DefaultPolicy()
	pol.Runtime = s.opts.Runtime
	pol.MemoryBytes = 256 << 20
	return &run{
		spec: sandbox.Spec{
			Image:     s.opts.Image,
			Cmd:       []string{"sh", "-c", script},
			Labels:    labels,
			Run:       model.RunRef{UserID: "sandboxtest", ConversationID: "sandboxtest", TaskID: "conformance", RunID: labels[LabelCase]},
			Timeout:   2 * time.Minute,
			StopGrace: time.Second,
		},
		policy: pol,
	}
}

// caseLabels returns the suite's labels plus a unique case label.
func (s *suite) caseLabels(t *testing.T) map[string]string {
	t.Helper()
	labels := map[string]string{LabelCase: randomHex(t)}
	for k, v := range s.opts.Labels {
		labels[k] = v
	}
	return labels
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
	ids, err := s.opts.Leftovers(context.Background(), labels)
	require.NoError(t, err)
	require.Empty(t, ids, "containers left behind")
}

// capture runs script and returns its result, stdout and stderr.
func (s *suite) capture(t *testing.T, script string, tweak func(*run)) (sandbox.Result, string, string) {
	t.Helper()
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	var out, errOut lockedbuf.Buffer
	r := s.newRun(labels, script)
	r.stdout, r.stderr = &out, &errOut
	if tweak != nil {
		tweak(r)
	}
	res := s.execute(ctx, t, s.newBackend(t), r)
	s.requireNoLeftovers(t, labels)
	return res, out.String(), errOut.String()
}

func (s *suite) testExitCodes(t *testing.T) {
	for _, code := range []int{0, 1, 4} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			res, _, _ := s.capture(t, fmt.Sprintf("exit %d", code), nil)
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
	res, out, errOut := s.capture(t, "echo out1; echo err1 >&2; echo out2; echo err2 >&2", nil)
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
	r := s.newRun(labels, "dd if=/dev/zero bs=1048576 count=100 2>/dev/null")
	r.stdout = counted
	res := s.execute(ctx, t, s.newBackend(t), r)
	require.NoError(t, res.Err)
	require.Equal(t, 0, res.ExitCode)
	want := sha256.Sum256(make([]byte, size))
	assert.Equal(t, int64(size), counted.n)
	assert.Equal(t, hex.EncodeToString(want[:]), hex.EncodeToString(got.Sum(nil)))
	s.requireNoLeftovers(t, labels)
}

func (s *suite) testFinalPartialLine(t *testing.T) {
	res, out, errOut := s.capture(t, "printf 'first\\nlast line without newline'; printf 'err tail' >&2; exit 2", nil)
	require.NoError(t, res.Err)
	assert.Equal(t, 2, res.ExitCode)
	assert.Equal(t, "first\nlast line without newline", out)
	assert.Equal(t, "err tail", errOut)
}

// testSlowConsumer spools stdout to a file through a writer that sleeps on
// every write, while the consumer of the spool reads nothing until the run is
// over: the container must still finish and every byte must arrive.
func (s *suite) testSlowConsumer(t *testing.T) {
	const size = 8 << 20
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	spoolPath := filepath.Join(t.TempDir(), "stdout.spool")
	f, err := os.Create(spoolPath)
	require.NoError(t, err)
	defer f.Close()
	r := s.newRun(labels, fmt.Sprintf("yes taskrun | head -c %d; printf tail", size))
	r.stdout = &sleepyWriter{w: f, delay: time.Millisecond}

	consumerMayRead := make(chan struct{})
	consumed := make(chan []byte, 1)
	go func() {
		<-consumerMayRead
		consumed <- slowReadAll(spoolPath, size+4)
	}()
	res := s.execute(ctx, t, s.newBackend(t), r)
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
	res, _, _ := s.capture(t, "tail /dev/zero", func(r *run) {
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
	res, out, _ := s.capture(t, `trap "" TERM; echo started; sleep 1000 & wait; echo survived`, func(r *run) {
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
	ready := &signalWriter{marker: []byte("ready"), seen: make(chan struct{})}
	r := s.newRun(labels, `trap 'echo bye; exit 0' TERM; echo ready; sleep 1000 & wait`)
	b := s.newBackend(t)
	h, err := b.Start(runCtx, r.spec, r.policy, sandbox.Streams{Stdout: ready})
	require.NoError(t, err)
	select {
	case <-ready.seen:
	case <-ctx.Done():
		t.Fatal("container never printed its ready marker")
	}
	cancel()
	res := h.Wait(runCtx)
	require.NoError(t, res.Err)
	assert.True(t, res.Cancelled)
	assert.False(t, res.TimedOut)
	assert.False(t, res.Succeeded())
	assert.Equal(t, "ready\nbye\n", string(ready.buf), "output written while stopping was lost")
	require.NoError(t, h.Close(runCtx), "Close must work with the run's cancelled context")
	s.requireNoLeftovers(t, labels)
}

func (s *suite) testConcurrent(t *testing.T) {
	const n = 8
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	b := s.newBackend(t)
	var wg sync.WaitGroup
	results := make([]sandbox.Result, n)
	outs := make([]lockedbuf.Buffer, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			r := s.newRun(labels, fmt.Sprintf("echo run %d; exit %d", i, i%3))
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
	res, out, _ := s.capture(t, script, nil)
	require.NoError(t, res.Err)
	require.Equal(t, 0, res.ExitCode)
	assert.Contains(t, out, "CapEff: 0000000000000000\n")
	assert.Contains(t, out, "CapBnd: 0000000000000000\n")
	if s.opts.Runtime != sandbox.RuntimeGVisor {
		// gVisor's /proc/self/status has no NoNewPrivs line.
		assert.Contains(t, out, "NoNewPrivs: 1\n")
	}
	assert.Contains(t, out, "uid=10001 gid=10001\n")
	assert.Contains(t, out, "rootfs=readonly\n")
	assert.Contains(t, out, "tmp=writable\n")
	assert.Contains(t, out, fmt.Sprintf("nofile=%d core=0\n", sandbox.DefaultNoFile))
	assert.Contains(t, out, "ifaces=lo \n")
	assert.Contains(t, out, "tmp=exec\n", "/tmp must allow exec (see the docker backend's TmpfsPath)")
	if s.opts.Runtime != sandbox.RuntimeGVisor {
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
	const attempts = 100
	res, out, _ := s.capture(t, fmt.Sprintf("for i in $(seq %d); do sleep 30 & echo $i; done; echo all", attempts), func(r *run) {
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
	script := `echo from-container > /rw/made && cat /ro/given && (echo x > /ro/nope 2>/dev/null && echo ro=writable || echo ro=readonly)`
	res, out, _ := s.capture(t, script, func(r *run) {
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
	res, out, _ := s.capture(t, "uname -r; dmesg 2>/dev/null | head -n 3", nil)
	require.NoError(t, res.Err)
	lines := strings.SplitN(out, "\n", 2)
	if s.opts.Runtime == sandbox.RuntimeGVisor {
		assert.Equal(t, "4.4.0", lines[0])
		assert.Contains(t, out, "gVisor")
		return
	}
	assert.NotEqual(t, "4.4.0", lines[0])
	assert.NotContains(t, out, "gVisor")
}

// testStartFailure makes Start fail after the container was created (a file
// bind-mounted over the image's /bin directory is refused when the container
// starts) and with a cancelled context, and checks nothing is left behind
// either way.
func (s *suite) testStartFailure(t *testing.T) {
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	b := s.newBackend(t)
	r := s.newRun(labels, "true")
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	r.spec.Mounts = []sandbox.Mount{{Source: file, Target: "/bin"}}
	_, err := b.Start(ctx, r.spec, r.policy, sandbox.Streams{})
	require.Error(t, err)
	s.requireNoLeftovers(t, labels)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.Start(cancelled, s.newRun(labels, "true").spec, r.policy, sandbox.Streams{})
	require.ErrorIs(t, err, context.Canceled)
	s.requireNoLeftovers(t, labels)
}

// testCloseWithoutWait closes a running handle, as a caller that failed
// elsewhere does, and checks the container is gone and Close is idempotent.
func (s *suite) testCloseWithoutWait(t *testing.T) {
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	r := s.newRun(labels, "sleep 1000")
	h, err := s.newBackend(t).Start(ctx, r.spec, r.policy, sandbox.Streams{})
	require.NoError(t, err)
	require.NoError(t, h.Close(ctx))
	require.NoError(t, h.Close(ctx))
	s.requireNoLeftovers(t, labels)
}

// testReaper plants an orphan as a killed executor leaves it and checks the
// reaper removes it while sparing a live run of the same backend.
func (s *suite) testReaper(t *testing.T) {
	if s.opts.Orphan == nil || s.opts.Reap == nil {
		t.Skip("backend has no reaper hooks")
	}
	ctx := caseContext(t)
	labels := s.caseLabels(t)
	b := s.newBackend(t)
	orphan, err := s.opts.Orphan(ctx, labels)
	require.NoError(t, err)
	r := s.newRun(labels, "sleep 1000")
	live, err := b.Start(ctx, r.spec, r.policy, sandbox.Streams{})
	require.NoError(t, err)
	defer live.Close(context.Background())

	require.NoError(t, s.opts.Reap(ctx, b, labels))
	left, err := s.opts.Leftovers(ctx, labels)
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

// signalWriter keeps what is written and closes seen once marker appeared.
type signalWriter struct {
	marker []byte
	seen   chan struct{}
	buf    []byte
	done   bool
}

// Write implements io.Writer.
func (s *signalWriter) Write(p []byte) (int, error) {
	s.buf = append(s.buf, p...)
	if !s.done && bytes.Contains(s.buf, s.marker) {
		s.done = true
		close(s.seen)
	}
	return len(p), nil
}
