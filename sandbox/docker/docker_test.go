package docker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
)

// testImage is the local image every container test uses.
const testImage = "taskrun/testbox:local"

// labelTest carries a per-test unique value so tests only touch their own containers.
const labelTest = "dev.taskrun.test"

// newTestBackend connects to the engine and, at cleanup, force-removes every
// container carrying the test's unique label.
func newTestBackend(t *testing.T, opts ...Option) (*Backend, map[string]string) {
	t.Helper()
	b, err := New(t.Context(), opts...)
	require.NoError(t, err)
	labels := map[string]string{labelTest: uniqueValue(t)}
	t.Cleanup(func() {
		ids, err := b.listLabelled(context.Background(), labels)
		require.NoError(t, err)
		for _, id := range ids {
			require.NoError(t, b.removeContainer(context.Background(), id))
		}
		require.NoError(t, b.Close())
	})
	return b, labels
}

// uniqueValue returns a random hex string naming the test.
func uniqueValue(t *testing.T) string {
	t.Helper()
	var p [8]byte
	_, err := rand.Read(p[:])
	require.NoError(t, err)
	return hex.EncodeToString(p[:])
}

// listLabelled lists the IDs of all containers carrying every label.
func (b *Backend) listLabelled(ctx context.Context, labels map[string]string) ([]string, error) {
	f := filters.NewArgs()
	for k, v := range labels {
		f.Add("label", k+"="+v)
	}
	cs, err := b.api.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

func TestRunEchoesAndExits(t *testing.T) {
	b, labels := newTestBackend(t)
	var out, errOut bytes.Buffer
	spec := sandbox.Spec{Image: testImage, Cmd: []string{"sh", "-c", "echo hello; echo oops >&2; exit 3"}, Labels: labels, Timeout: time.Minute}
	h, err := b.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{Stdout: &out, Stderr: &errOut})
	require.NoError(t, err)
	res := h.Wait(t.Context())
	require.NoError(t, res.Err)
	require.NoError(t, h.Close(t.Context()))
	require.Equal(t, 3, res.ExitCode)
	require.Equal(t, "hello\n", out.String())
	require.Equal(t, "oops\n", errOut.String())
	ids, err := b.listLabelled(t.Context(), labels)
	require.NoError(t, err)
	require.Empty(t, ids)
}

func TestNewDaemonDown(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+t.TempDir()+"/no.sock")
	_, err := New(t.Context())
	require.ErrorIs(t, err, sandbox.ErrDaemonUnavailable)
	require.ErrorContains(t, err, "DOCKER_HOST")
}

func TestStartMissingImage(t *testing.T) {
	b, labels := newTestBackend(t)
	for _, wrapper := range [][]string{nil, {"/probe", "--"}} {
		spec := sandbox.Spec{Image: "taskrun/does-not-exist:" + uniqueValue(t), Wrapper: wrapper, Labels: labels}
		_, err := b.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{})
		require.ErrorIs(t, err, sandbox.ErrImageNotFound)
		require.ErrorContains(t, err, "taskrun images build")
	}
}

func TestWrapperRunsInFrontOfTheCommand(t *testing.T) {
	b, labels := newTestBackend(t)
	wrapper := []string{"sh", "-c", `echo "wrapped $*"; exec "$@"`, "wrapper"}
	for _, tt := range []struct {
		name string
		cmd  []string
		want string
	}{
		{"spec command", []string{"echo", "hi"}, "wrapped echo hi\nhi\n"},
		{"image command", nil, "wrapped /bin/sh\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			spec := sandbox.Spec{Image: testImage, Cmd: tt.cmd, Wrapper: wrapper, Labels: labels, Timeout: time.Minute}
			h, err := b.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{Stdout: &out})
			require.NoError(t, err)
			res := h.Wait(t.Context())
			require.NoError(t, h.Close(t.Context()))
			require.NoError(t, res.Err)
			require.Equal(t, 0, res.ExitCode)
			require.Equal(t, tt.want, out.String())
		})
	}
}

func TestHostFacts(t *testing.T) {
	b, _ := newTestBackend(t)
	host, err := b.HostFacts(t.Context())
	require.NoError(t, err)
	require.NotEmpty(t, host.ServerVersion)
	require.Contains(t, host.Runtimes, "runc")
	require.True(t, host.Seccomp, "the engine supports seccomp")
}
