package docker

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
)

// waitFailsAPI is an engine whose wait request fails at once, as on a daemon
// hiccup between attach and start. Only the calls Start makes are served.
type waitFailsAPI struct {
	dockerAPI
	removed chan struct{}
}

func (waitFailsAPI) ContainerCreate(context.Context, *container.Config, *container.HostConfig, *network.NetworkingConfig, string) (container.CreateResponse, error) {
	return container.CreateResponse{ID: "0123456789abcdef"}, nil
}

func (waitFailsAPI) ContainerAttach(context.Context, string, container.AttachOptions) (types.HijackedResponse, error) {
	conn, _ := net.Pipe()
	return types.NewHijackedResponse(conn, ""), nil
}

func (waitFailsAPI) ContainerWait(context.Context, string, container.WaitCondition) (<-chan container.WaitResponse, <-chan error) {
	errC := make(chan error, 1)
	errC <- errors.New("daemon hiccup")
	return make(chan container.WaitResponse), errC
}

func (a waitFailsAPI) ContainerRemove(context.Context, string, container.RemoveOptions) error {
	close(a.removed)
	return nil
}

// A start that fails after attaching returns an error and removes the
// container; it never waits on a demultiplexer that was not started.
func TestStartFailingAfterAttachReturnsAndCleansUp(t *testing.T) {
	api := waitFailsAPI{removed: make(chan struct{})}
	b := &Backend{api: api, log: slog.Default(), stopGrace: time.Second, now: time.Now, live: map[string]*handle{}}
	done := make(chan error, 1)
	go func() {
		_, err := b.Start(context.Background(), sandbox.Spec{Image: "x", Cmd: []string{"true"}}, sandbox.DefaultPolicy(), sandbox.Streams{})
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Start hung after a failed wait request")
	}
	select {
	case <-api.removed:
	default:
		assert.Fail(t, "the created container was not removed")
	}
}
