package podhelper

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

func TestGateHoldsTheCommandUntilReleased(t *testing.T) {
	marker := t.TempDir() + "/ran"
	cmd := helperCmd(t, "gate", "--", "sh", "-c", "touch "+marker+"; read x; echo stdin=${x:-empty}; exit 3")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	var out bytes.Buffer
	cmd.Stdout = &out
	tokens := make(chan struct{})
	var once sync.Once
	cmd.Stderr = NewGateFilter(io.Discard, func() { once.Do(func() { close(tokens) }) })
	require.NoError(t, cmd.Start())
	select {
	case <-tokens:
	case <-time.After(10 * time.Second):
		t.Fatal("the gate never announced itself on stderr")
	}
	// The gate is waiting: nothing ran. (A blocked read cannot be observed
	// directly; the marker is created only by the command.)
	time.Sleep(200 * time.Millisecond)
	assert.NoFileExists(t, marker, "the command ran before the gate was released")
	_, err = stdin.Write([]byte("g\nsecret input\n"))
	require.NoError(t, err)
	code := exitCode(t, cmd.Wait())
	assert.Equal(t, 3, code, "the gate exits with the command's status")
	assert.FileExists(t, marker)
	assert.Equal(t, "stdin=empty\n", out.String(), "the command's stdin is /dev/null, not the executor's")
}

func TestGateClosedStdinNeverRunsTheCommand(t *testing.T) {
	marker := t.TempDir() + "/ran"
	cmd := helperCmd(t, "gate", "--", "touch", marker)
	cmd.Stdin = bytes.NewReader(nil)
	assert.Equal(t, GateClosedExitCode, exitCode(t, cmd.Run()))
	assert.NoFileExists(t, marker)
}

func TestGateForwardsSignalsAndReportsDeath(t *testing.T) {
	cmd := helperCmd(t, "gate", "--", "sh", "-c", `trap 'echo term; exit 7' TERM; echo up; while :; do sleep 0.05; done`)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	var out syncBuffer
	cmd.Stdout = &out
	require.NoError(t, cmd.Start())
	_, err = stdin.Write([]byte("g"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return bytes.Contains(out.Bytes(), []byte("up\n")) }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	assert.Equal(t, 7, exitCode(t, cmd.Wait()), "SIGTERM reaches the command, whose status the gate returns")
	assert.Contains(t, string(out.Bytes()), "term\n")

	killed := helperCmd(t, "gate", "--", "sh", "-c", "kill -KILL $$")
	killed.Stdin = bytes.NewReader([]byte("g"))
	assert.Equal(t, 128+9, exitCode(t, killed.Run()), "a command killed by a signal gives 128+signal")
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
