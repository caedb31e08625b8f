package docker

import (
	"context"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxtest"
)

func TestConformanceRunc(t *testing.T) {
	t.Parallel()
	runConformance(t, "")
}

func TestConformanceGVisor(t *testing.T) {
	t.Parallel()
	runConformance(t, sandbox.RuntimeGVisor)
}

// runConformance runs the sandboxtest suite against this backend under runtime.
func runConformance(t *testing.T, runtime string) {
	b, labels := newTestBackend(t)
	sandboxtest.Run(t, func(t *testing.T) sandbox.Backend {
		nb, _ := newTestBackend(t)
		return nb
	}, sandboxtest.Options{
		Runtime:   runtime,
		Labels:    labels,
		Leftovers: b.listLabelled,
		Orphan: func(ctx context.Context, labels map[string]string) (string, error) {
			return plantOrphan(ctx, b, labels, runtime)
		},
		Reap: func(ctx context.Context, sb sandbox.Backend, labels map[string]string) error {
			_, err := sb.(*Backend).Reap(ctx, ReapOptions{Labels: labels, Grace: time.Millisecond, All: true})
			return err
		},
	})
}

// plantOrphan creates and starts, directly through the engine API, a running
// container labelled as a run that started an hour ago with a 10-minute
// timeout: what an executor killed mid-run leaves behind.
func plantOrphan(ctx context.Context, b *Backend, labels map[string]string, runtime string) (string, error) {
	return plantContainer(ctx, b, labels, runtime, time.Now().Add(-time.Hour), "sleep", "1000")
}

// plantContainer creates and starts a managed container behind the backend's
// back, labelled as created at created with a 10-minute timeout.
func plantContainer(ctx context.Context, b *Backend, labels map[string]string, runtime string, created time.Time, cmd ...string) (string, error) {
	spec := sandbox.Spec{Image: testImage, Cmd: cmd, Labels: labels,
		Run: model.RunRef{RunID: "orphan"}, Timeout: 10 * time.Minute, StopGrace: time.Second}
	pol := sandbox.DefaultPolicy()
	pol.Runtime = runtime
	cc := convert(spec, pol, created, time.Minute)
	c, err := b.api.ContainerCreate(ctx, cc.Config, cc.Host, cc.Network, "")
	if err != nil {
		return "", err
	}
	return c.ID, b.api.ContainerStart(ctx, c.ID, container.StartOptions{})
}

func TestPlantOrphanIsExpired(t *testing.T) {
	b, labels := newTestBackend(t)
	id, err := plantOrphan(t.Context(), b, labels, "")
	require.NoError(t, err)
	info, _, err := b.api.ContainerInspectWithRaw(t.Context(), id, false)
	require.NoError(t, err)
	expires, ok := labelTime(info.Config.Labels, sandbox.LabelExpires)
	require.True(t, ok)
	require.True(t, expires.Before(time.Now()))
	require.True(t, info.State.Running)
}
