package docker

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/sandbox"
)

// SignalExec signals a command started by Exec in its own container only:
// named with another container, it refuses and the command runs on; once
// the command ended, it says so.
func TestSignalExecReachesOnlyItsContainersCommand(t *testing.T) {
	b, labels := newTestBackend(t)
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	defer cli.Close()
	start := func() sandbox.Handle {
		h, err := b.Start(t.Context(), sandbox.Spec{Image: testImage, Labels: labels, Timeout: time.Minute, StopGrace: time.Second,
			Cmd: []string{"sleep", "60"}}, sandbox.DefaultPolicy(), sandbox.Streams{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = h.Close(context.Background()) })
		return h
	}
	a, other := start(), start()

	var out lockedbuf.Buffer
	started := make(chan string, 1)
	exited := make(chan int, 1)
	go func() {
		code, err := Exec(t.Context(), cli, a.ID(), ExecOptions{
			Cmd:    []string{"sh", "-c", `trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.1; done`},
			Stdout: &out, Stderr: &out, Started: func(id string) { started <- id },
		})
		if err != nil {
			code = -1
		}
		exited <- code
	}()
	execID := <-started
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "ready") }, time.Minute, 10*time.Millisecond)

	require.Error(t, SignalExec(t.Context(), cli, other.ID(), execID, syscall.SIGKILL), "another container's command")
	info, err := cli.ContainerExecInspect(t.Context(), execID)
	require.NoError(t, err)
	assert.True(t, info.Running, "the signal named with another container reached the command")

	require.NoError(t, SignalExec(t.Context(), cli, a.ID(), execID, syscall.SIGTERM))
	select {
	case code := <-exited:
		assert.Equal(t, 7, code)
	case <-time.After(time.Minute):
		t.Fatal("the command did not end on SIGTERM")
	}
	assert.ErrorIs(t, SignalExec(t.Context(), cli, a.ID(), execID, syscall.SIGTERM), ErrExecNotRunning)
}
