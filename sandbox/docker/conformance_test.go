package docker

import (
	"context"
	"maps"
	"os"
	"path/filepath"
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
	sandboxtest.Run(t, &harness{b: b, labels: labels, runtime: runtime})
}

// harness is the Docker backend's sandboxtest.Harness: every capability.
type harness struct {
	b       *Backend
	labels  map[string]string
	runtime string
}

func (h *harness) NewBackend(t *testing.T) sandbox.Backend {
	nb, _ := newTestBackend(t)
	return nb
}

func (h *harness) Capabilities() sandboxtest.Capabilities {
	return sandboxtest.Capabilities{Confinement: true, OOM: true, Runtimes: true, LagTolerant: true, Reaper: h}
}

func (h *harness) Prepare(spec *sandbox.Spec, policy *sandbox.Policy) {
	spec.Image = sandboxtest.DefaultImage
	spec.Labels = maps.Clone(spec.Labels)
	maps.Copy(spec.Labels, h.labels)
	policy.Runtime = h.runtime
}

func (h *harness) Command(_ *testing.T, _ sandbox.Backend, w sandboxtest.Workload) []string {
	return sandboxtest.ShellCommand(w)
}

// BreakStart bind-mounts a file over the image's /bin directory, which the
// engine accepts at create and refuses at start.
func (h *harness) BreakStart(t *testing.T, _ sandbox.Backend, spec *sandbox.Spec) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	spec.Mounts = []sandbox.Mount{{Source: file, Target: "/bin"}}
}

func (h *harness) Leftovers(ctx context.Context, labels map[string]string) ([]string, error) {
	return h.b.listLabelled(ctx, withLabels(labels, h.labels))
}

func (h *harness) Orphan(ctx context.Context, labels map[string]string) (string, error) {
	return plantOrphan(ctx, h.b, withLabels(labels, h.labels), h.runtime)
}

func (h *harness) Reap(ctx context.Context, b sandbox.Backend, labels map[string]string) error {
	_, err := b.(*Backend).Reap(ctx, ReapOptions{Labels: withLabels(labels, h.labels), Grace: time.Millisecond, All: true})
	return err
}

// withLabels is a merged copy of a and b.
func withLabels(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
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
