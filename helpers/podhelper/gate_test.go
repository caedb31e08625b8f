package podhelper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testdeadline"
)

// mainEnv makes the test binary act as the helper (TestMain).
const mainEnv = "TASKRUN_PODHELPER_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// helperCmd runs the helper (this test binary) with args.
func helperCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	return cmd
}

// exitCode is cmd's exit status after Wait.
func exitCode(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// executor plays the executor's side of a gate: it counts the gate's
// stdout and its stderr after the marker, as the backend does, and
// acknowledges them on the gate's stdin once acknowledging starts.
type executor struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	acker  *Acker
	stdout syncBuffer
	stderr syncBuffer
	tokens chan struct{}
	exited chan error
}

// startGate starts the helper's gate with args and waits until it
// announced itself. out, when non-nil, receives the gate's stdout instead
// of the executor's buffer (still counted).
func startGate(t *testing.T, out io.Writer, args ...string) *executor {
	t.Helper()
	e := &executor{cmd: helperCmd(t, append([]string{"gate"}, args...)...), acker: NewAcker(),
		tokens: make(chan struct{}), exited: make(chan error, 1)}
	var err error
	e.stdin, err = e.cmd.StdinPipe()
	require.NoError(t, err)
	if out == nil {
		out = &e.stdout
	}
	e.cmd.Stdout = e.acker.Stdout(out)
	var once sync.Once
	e.cmd.Stderr = NewGateFilter(e.acker.Stderr(&e.stderr), func() { once.Do(func() { close(e.tokens) }) })
	require.NoError(t, e.cmd.Start())
	t.Cleanup(func() { _ = e.cmd.Process.Kill() })
	select {
	case <-e.tokens:
	case <-time.After(10 * time.Second):
		t.Fatal("the gate never announced itself on stderr")
	}
	return e
}

// release sends the byte that starts the command.
func (e *executor) release(t *testing.T) {
	t.Helper()
	_, err := e.stdin.Write([]byte("g"))
	require.NoError(t, err)
	go func() { e.exited <- e.cmd.Wait() }()
}

// acknowledge starts acknowledging what was received.
func (e *executor) acknowledge(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = e.acker.Run(ctx, e.stdin, 5*time.Millisecond) }()
}

// wait returns the gate's exit status; within, written for an idle
// machine, is scaled to this one's slowdown.
func (e *executor) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	within = testdeadline.Scale(within)
	select {
	case err := <-e.exited:
		return exitCode(t, err)
	case <-time.After(within):
		t.Fatalf("the gate did not exit within %s", within)
		return -1
	}
}

func TestGateHoldsTheCommandUntilReleased(t *testing.T) {
	marker := t.TempDir() + "/ran"
	e := startGate(t, nil, "--", "sh", "-c", "touch "+marker+"; read x; echo stdin=${x:-empty}; exit 3")
	// The gate is waiting: nothing ran. (A blocked read cannot be observed
	// directly; the marker is created only by the command.)
	time.Sleep(200 * time.Millisecond)
	assert.NoFileExists(t, marker, "the command ran before the gate was released")
	_, err := e.stdin.Write([]byte("g\nsecret input\n"))
	require.NoError(t, err)
	go func() { e.exited <- e.cmd.Wait() }()
	e.acknowledge(t)
	assert.Equal(t, 3, e.wait(t, 10*time.Second), "the gate exits with the command's status")
	assert.FileExists(t, marker)
	assert.Equal(t, "stdin=empty\n", string(e.stdout.Bytes()), "the command's stdin is /dev/null, not the executor's")
}

func TestGateClosedStdinNeverRunsTheCommand(t *testing.T) {
	marker := t.TempDir() + "/ran"
	cmd := helperCmd(t, "gate", "--", "touch", marker)
	cmd.Stdin = bytes.NewReader(nil)
	assert.Equal(t, GateClosedExitCode, exitCode(t, cmd.Run()))
	assert.NoFileExists(t, marker)
}

func TestGateForwardsSignalsAndReportsDeath(t *testing.T) {
	e := startGate(t, nil, "--", "sh", "-c", `trap 'echo term; exit 7' TERM; echo up; while :; do sleep 0.05; done`)
	e.release(t)
	e.acknowledge(t)
	require.Eventually(t, func() bool { return bytes.Contains(e.stdout.Bytes(), []byte("up\n")) }, testdeadline.Scale(10*time.Second), 10*time.Millisecond)
	require.NoError(t, e.cmd.Process.Signal(syscall.SIGTERM))
	assert.Equal(t, 7, e.wait(t, 10*time.Second), "SIGTERM reaches the command, whose status the gate returns")
	assert.Contains(t, string(e.stdout.Bytes()), "term\n")

	killed := startGate(t, nil, "--", "sh", "-c", "kill -KILL $$")
	killed.release(t)
	killed.acknowledge(t)
	assert.Equal(t, 128+9, killed.wait(t, 10*time.Second), "a command killed by a signal gives 128+signal")
}

// gatedWriter blocks every write until opened.
type gatedWriter struct {
	open chan struct{}
	buf  syncBuffer
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	<-g.open
	return g.buf.Write(p)
}

func TestGateHoldsItsExitUntilEveryByteIsAcknowledged(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
		// exitsFirst: the output fits in the pipes, so the command exits
		// before a byte of it is read, and all of it is in flight.
		exitsFirst bool
	}{
		{"in flight after the command exited", 96 << 10, true},
		{"far more than the pipes hold", 4 << 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := t.TempDir() + "/exited"
			// The reader lags: nothing of stdout is taken until it opens.
			lag := &gatedWriter{open: make(chan struct{})}
			e := startGate(t, lag, "--", "sh", "-c",
				fmt.Sprintf("yes taskrun | head -c %d; printf tail; printf 'err tail' >&2; touch %s; exit 4", tc.size, marker))
			e.release(t)
			e.acknowledge(t)
			if tc.exitsFirst {
				require.Eventually(t, func() bool { _, err := os.Stat(marker); return err == nil }, testdeadline.Scale(10*time.Second), 10*time.Millisecond)
			}
			select {
			case err := <-e.exited:
				t.Fatalf("the gate exited before its output was read: %v", err)
			case <-time.After(time.Second):
			}
			close(lag.open)
			assert.Equal(t, 4, e.wait(t, 30*time.Second))
			want := append(bytes.Repeat([]byte("taskrun\n"), tc.size/8), "tail"...)
			got := lag.buf.Bytes()
			require.Equal(t, len(want), len(got))
			assert.True(t, bytes.Equal(want, got), "stdout differs from what the command wrote")
			assert.Equal(t, "err tail", string(e.stderr.Bytes()))
			assert.Equal(t, Counts{Stdout: int64(len(want)), Stderr: 8}, e.acker.Counts())
		})
	}
}

func TestGateWaitsForTheAcknowledgementNotJustTheReader(t *testing.T) {
	e := startGate(t, nil, "--ack-idle", "1m", "--", "sh", "-c", "echo out; echo err >&2")
	e.release(t)
	require.Eventually(t, func() bool {
		return string(e.stdout.Bytes()) == "out\n" && string(e.stderr.Bytes()) == "err\n"
	}, 10*time.Second, 10*time.Millisecond)
	select {
	case err := <-e.exited:
		t.Fatalf("the gate exited without an acknowledgement: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	// One byte short on stderr: still held.
	_, err := e.stdin.Write(AppendAck(nil, Counts{Stdout: 4, Stderr: 3}))
	require.NoError(t, err)
	select {
	case err := <-e.exited:
		t.Fatalf("the gate exited on a short acknowledgement: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	_, err = e.stdin.Write(AppendAck(nil, Counts{Stdout: 4, Stderr: 4}))
	require.NoError(t, err)
	assert.Equal(t, 0, e.wait(t, 10*time.Second))
}

func TestGateDoesNotWaitForAGoneExecutor(t *testing.T) {
	// Its session ended (stdin closed): no acknowledgement can come, the
	// gate exits at once, with the command's status.
	e := startGate(t, nil, "--ack-idle", "1m", "--", "sh", "-c", "echo out; exit 5")
	e.release(t)
	require.Eventually(t, func() bool { return string(e.stdout.Bytes()) == "out\n" }, testdeadline.Scale(10*time.Second), 10*time.Millisecond)
	require.NoError(t, e.stdin.Close())
	assert.Equal(t, 5, e.wait(t, 10*time.Second))

	// Its session stays open but it never acknowledges: the gate exits
	// after the idle period.
	e = startGate(t, nil, "--ack-idle", "300ms", "--", "sh", "-c", "echo out; exit 6")
	start := time.Now()
	e.release(t)
	assert.Equal(t, 6, e.wait(t, 10*time.Second))
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
}

func TestGateArguments(t *testing.T) {
	opts, argv, err := parseGateArgs([]string{"--", "sh", "-c", "x"})
	require.NoError(t, err)
	assert.Equal(t, gateOptions{ackIdle: DefaultAckIdle, terminationLog: TerminationLog}, opts)
	assert.Equal(t, []string{"sh", "-c", "x"}, argv)
	opts, argv, err = parseGateArgs([]string{"--termination-log", "/tmp/t", "--ack-idle", "2s", "--", "true", "--ack-idle"})
	require.NoError(t, err)
	assert.Equal(t, gateOptions{ackIdle: 2 * time.Second, terminationLog: "/tmp/t"}, opts)
	assert.Equal(t, []string{"true", "--ack-idle"}, argv)
	for _, bad := range [][]string{{}, {"--"}, {"sh"}, {"--ack-idle", "x", "--", "true"}, {"--ack-idle", "0s", "--", "true"},
		{"--ack-idle", "--", "true"}, {"--termination-log", "", "--", "true"}, {"--other", "x", "--", "true"}} {
		_, _, err := parseGateArgs(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestGateTerminationMessageSaysWhetherOutputMayBeLost(t *testing.T) {
	// The command writes a message of its own there; the gate's replaces it.
	forge := func(path string) string {
		return fmt.Sprintf("printf '%s forged' > %s; echo out", UnacknowledgedPrefix, path)
	}
	log := t.TempDir() + "/termination-log"
	require.NoError(t, os.WriteFile(log, nil, 0o666))
	e := startGate(t, nil, "--termination-log", log, "--", "sh", "-c", forge(log))
	e.release(t)
	e.acknowledge(t)
	assert.Equal(t, 0, e.wait(t, 10*time.Second))
	data, err := os.ReadFile(log)
	require.NoError(t, err)
	assert.Empty(t, string(data), "everything acknowledged: no message, whatever the command wrote")

	lost := t.TempDir() + "/termination-log"
	require.NoError(t, os.WriteFile(lost, nil, 0o666))
	e = startGate(t, nil, "--ack-idle", "200ms", "--termination-log", lost, "--", "sh", "-c", "echo out; echo err >&2")
	e.release(t)
	assert.Equal(t, 0, e.wait(t, 10*time.Second))
	data, err = os.ReadFile(lost)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(data), UnacknowledgedPrefix), "%q", data)
	assert.Contains(t, string(data), "0 of 4 bytes of stdout, 0 of 4 of stderr")

	// No termination message file (not in a Pod): none is created.
	missing := t.TempDir() + "/none"
	e = startGate(t, nil, "--ack-idle", "100ms", "--termination-log", missing, "--", "true")
	e.release(t)
	assert.Equal(t, 0, e.wait(t, 10*time.Second))
	assert.NoFileExists(t, missing)
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

// Bytes is a copy of what was written.
func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.buf.Bytes())
}
