package kubernetes

import (
	"context"
	"crypto/rand"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/taskrun/taskrun/images"
	"github.com/taskrun/taskrun/internal/kubetest"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxtest"
)

// testEnv is a restricted namespace of the test cluster for one test.
type testEnv struct {
	cluster   *kubetest.Cluster
	namespace string
	instance  string
}

// requireCluster returns a restricted namespace of the test's own on the
// cluster (deleted when the test ends), or skips the test when no cluster
// is up (fails it in CI).
func requireCluster(t *testing.T) *testEnv {
	t.Helper()
	c := kubetest.Require(t)
	c.RequireImage(t, images.PodHelperRef)
	c.RequireImage(t, kubetest.TestboxImage)
	return &testEnv{cluster: c, namespace: c.Namespace(t), instance: "kubetest-" + randomSuffix(t)}
}

// newTestBackend is a backend on the test namespace with small requests.
func newTestBackend(t *testing.T, e *testEnv, opts ...Option) *Backend {
	t.Helper()
	opts = append([]Option{WithInstance(e.instance), WithStopGrace(time.Second)}, opts...)
	b, err := New(t.Context(), e.cluster.Config, e.namespace, opts...)
	require.NoError(t, err)
	return b
}

func randomSuffix(t *testing.T) string {
	t.Helper()
	return strings.ToLower(rand.Text()[:8])
}

func TestConformance(t *testing.T) {
	e := requireCluster(t)
	sandboxtest.Run(t, &harness{env: e, b: newTestBackend(t, e)})
}

// harness is the Kubernetes backend's sandboxtest.Harness.
type harness struct {
	env *testEnv
	b   *Backend
}

func (h *harness) NewBackend(t *testing.T) sandbox.Backend { return newTestBackend(t, h.env) }

func (h *harness) Capabilities() sandboxtest.Capabilities {
	return sandboxtest.Capabilities{
		OOM: true,
		// The gate holds the run container's exit until the executor
		// acknowledged every byte of its output.
		LagTolerant: true,
		Reaper:      h,
		Gaps: map[string]string{
			"Confinement": "a Pod has no open-files ulimit and no pids limit of its own (the kubelet's podPidsLimit is node-wide), " +
				"and it has its own network interface, whose traffic the run's NetworkPolicy denies, rather than none",
			"Runtimes": "the test cluster has no gVisor RuntimeClass",
		},
	}
}

func (h *harness) Prepare(spec *sandbox.Spec, policy *sandbox.Policy) {
	spec.Image = sandboxtest.DefaultImage
	// The node has 2 CPUs shared by every test: small limits.
	policy.NanoCPUs = 500_000_000
}

func (h *harness) Command(_ *testing.T, _ sandbox.Backend, w sandboxtest.Workload) []string {
	return sandboxtest.ShellCommand(w)
}

// BreakStart names an image the node does not have: the Pod is created and
// its run container can never start (images are never pulled).
func (h *harness) BreakStart(_ *testing.T, _ sandbox.Backend, spec *sandbox.Spec) {
	spec.Image = "taskrun/no-such-image:local"
}

func (h *harness) Leftovers(ctx context.Context, labels map[string]string) ([]string, error) {
	return h.b.ListManaged(ctx, labels)
}

// Orphan creates a Pod behind the backend's back, as a killed executor
// leaves it: labelled as created an hour ago with a 10-minute timeout.
func (h *harness) Orphan(ctx context.Context, labels map[string]string) (string, error) {
	spec := sandbox.Spec{Image: sandboxtest.DefaultImage, Cmd: []string{"sleep", "1000"}, Labels: labels,
		Run: model.RunRef{RunID: "orphan"}, Timeout: 10 * time.Minute, StopGrace: time.Second}
	cfg := h.b.podConfig(spec, "", time.Now().Add(-time.Hour))
	cfg.Instance = ""
	cv, err := convert(spec, sandbox.DefaultPolicy(), cfg)
	if err != nil {
		return "", err
	}
	if _, err := h.b.clientset().NetworkingV1().NetworkPolicies(h.b.namespace).Create(ctx, cv.NetworkPolicy, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	_, err = h.b.clientset().CoreV1().Pods(h.b.namespace).Create(ctx, cv.Pod, metav1.CreateOptions{})
	return cv.Pod.Name, err
}

func (h *harness) Reap(ctx context.Context, b sandbox.Backend, labels map[string]string) error {
	_, err := b.(*Backend).Reap(ctx, ReapOptions{Labels: maps.Clone(labels), Grace: time.Millisecond, All: true})
	return err
}
