package instance_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/instance"
)

// childEnv makes the test binary act as an executor that starts an instance,
// prints its Info and waits to be killed.
const childEnv = "TASKRUN_INSTANCE_TEST_CHILD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		inst, err := instance.Start(dir)
		if err != nil {
			os.Exit(3)
		}
		_ = json.NewEncoder(os.Stdout).Encode(inst.Info())
		select {} // until killed
	}
	os.Exit(m.Run())
}

// startChild runs an executor process and returns it with its Info.
func startChild(t *testing.T, dir string) (*exec.Cmd, instance.Info) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var info instance.Info
	require.NoError(t, json.NewDecoder(bufio.NewReader(out)).Decode(&info))
	return cmd, info
}

func TestKilledExecutorIsProvablyGone(t *testing.T) {
	dir := t.TempDir()
	cmd, info := startChild(t, dir)
	require.Equal(t, cmd.Process.Pid, info.PID)

	gone, why, err := instance.Gone(dir, info)
	require.NoError(t, err)
	assert.False(t, gone, why)

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	gone, why, err = instance.Gone(dir, info)
	require.NoError(t, err)
	assert.True(t, gone, why)
	assert.Contains(t, why, "released its lock")

	removed, err := instance.RemoveIfGone(dir, info.ID)
	require.NoError(t, err)
	assert.True(t, removed)
	assert.NoFileExists(t, filepath.Join(dir, info.ID+".lock"))
}

func TestOwnInstanceIsAliveUntilClosed(t *testing.T) {
	dir := t.TempDir()
	inst, err := instance.Start(dir)
	require.NoError(t, err)

	gone, why, err := instance.Gone(dir, inst.Info())
	require.NoError(t, err)
	assert.False(t, gone, why)
	removed, err := instance.RemoveIfGone(dir, inst.ID())
	require.NoError(t, err)
	assert.False(t, removed, "a live instance's lock file must never be removed")

	infos, err := instance.List(dir)
	require.NoError(t, err)
	require.Len(t, infos, 1)
	assert.Equal(t, inst.Info(), infos[0])

	require.NoError(t, inst.Close())
	// Without a lock file the process record decides: this process still
	// runs with the recorded start time, so it cannot be proven gone.
	gone, _, err = instance.Gone(dir, inst.Info())
	require.NoError(t, err)
	assert.False(t, gone)
}

func TestProcessRecordDecidesWithoutLockFile(t *testing.T) {
	dir := t.TempDir()
	self, err := instance.Self()
	require.NoError(t, err)
	self.ID = instance.NewID()

	gone, why, err := instance.Gone(dir, self)
	require.NoError(t, err)
	assert.False(t, gone, why)

	reused := self
	reused.StartTicks++
	gone, why, err = instance.Gone(dir, reused)
	require.NoError(t, err)
	assert.True(t, gone)
	assert.Contains(t, why, "another process")

	rebooted := self
	rebooted.BootID = "00000000-0000-0000-0000-000000000000"
	gone, why, err = instance.Gone(dir, rebooted)
	require.NoError(t, err)
	assert.True(t, gone)
	assert.Contains(t, why, "rebooted")

	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	exited := self
	exited.PID = cmd.ProcessState.Pid()
	gone, why, err = instance.Gone(dir, exited)
	require.NoError(t, err)
	assert.True(t, gone, why)

	unknown := instance.Info{ID: instance.NewID()}
	gone, _, err = instance.Gone(dir, unknown)
	require.NoError(t, err)
	assert.False(t, gone, "an executor without any record is never proven gone")

	_, _, err = instance.Gone(dir, instance.Info{ID: "../x"})
	assert.Error(t, err)
}

func TestTryLockIsExclusiveWithinAProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.lock")
	l, err := instance.TryLock(path)
	require.NoError(t, err)
	_, err = instance.TryLock(path)
	require.ErrorIs(t, err, instance.ErrLocked)
	held, err := instance.Held(path)
	require.NoError(t, err)
	assert.True(t, held)
	require.NoError(t, l.Unlock(false))
	held, err = instance.Held(path)
	require.NoError(t, err)
	assert.False(t, held)
}
