package kubernetes

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxtest"
)

// templateSpec is a short run for the template and namespace tests.
func templateSpec(run string) sandbox.Spec {
	return sandbox.Spec{Image: sandboxtest.DefaultImage, Cmd: []string{"sh", "-c", "echo ok"},
		Run: model.RunRef{RunID: run}, Timeout: time.Minute, StopGrace: time.Second}
}

// assertNoPod checks that nothing of the run was created.
func assertNoPod(t *testing.T, b *Backend, e *testEnv, run string) {
	t.Helper()
	left, err := b.ListManaged(t.Context(), map[string]string{sandbox.LabelRun: run, sandbox.LabelInstance: e.instance})
	require.NoError(t, err)
	assert.Empty(t, left, "a refused run creates no Pod")
}

// TestTemplateBoundsTheExecutorsFlags puts a template in the runs'
// namespace: a RuntimeClass (handler runc, made for the test), 256Mi of
// memory, 500m of CPU, 512 processes, 64Mi of disk, a 2 minute timeout. A
// run asking more than any of them, or another RuntimeClass, is refused
// with an error naming the template and the limit, and creates nothing; a
// run asking less gets what it asked, with the template's RuntimeClass and
// disk cap.
func TestTemplateBoundsTheExecutorsFlags(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e, WithRuntimeClass(sandbox.RuntimeGVisor, "gvisor"))
	cs := b.clientset()
	class := "taskrun-test-" + randomSuffix(t)
	_, err := cs.NodeV1().RuntimeClasses().Create(t.Context(), &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: class, Labels: map[string]string{"dev.taskrun.test": "true"}}, Handler: "runc"}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { // t.Context() is already cancelled here
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, cs.NodeV1().RuntimeClasses().Delete(ctx, class, metav1.DeleteOptions{}))
	})
	_, err = cs.CoreV1().ConfigMaps(e.namespace).Create(t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: TemplateName, Labels: map[string]string{LabelTemplate: "true"}},
		Data: map[string]string{"runtimeClass": class, "memory": "256Mi", "cpu": "500m", "pids": "512",
			"disk": "64Mi", "timeout": "2m", "egress": "none"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	source := e.namespace + "/" + TemplateName

	small := sandbox.DefaultPolicy()
	small.MemoryBytes, small.NanoCPUs = 128<<20, 250_000_000
	refused := map[string]func(*sandbox.Spec, *sandbox.Policy){
		"memory":       func(_ *sandbox.Spec, p *sandbox.Policy) { p.MemoryBytes = 512 << 20 },
		"cpu":          func(_ *sandbox.Spec, p *sandbox.Policy) { p.NanoCPUs = 1_000_000_000 },
		"pids":         func(_ *sandbox.Spec, p *sandbox.Policy) { p.PidsLimit = 1024 },
		"disk":         func(s *sandbox.Spec, _ *sandbox.Policy) { s.DiskBytes = 128 << 20 },
		"timeout":      func(s *sandbox.Spec, _ *sandbox.Policy) { s.Timeout = 10 * time.Minute },
		"runtimeClass": func(_ *sandbox.Spec, p *sandbox.Policy) { p.Runtime = sandbox.RuntimeGVisor },
		"egress": func(s *sandbox.Spec, _ *sandbox.Policy) {
			s.Labels = map[string]string{sandbox.LabelEgress: "/taskrun/egress/proxy.sock"}
		},
	}
	for limit, edit := range refused {
		t.Run(limit, func(t *testing.T) {
			spec, pol := templateSpec("tpl-"+limit), small
			edit(&spec, &pol)
			h, err := b.Start(t.Context(), spec, pol, sandbox.Streams{})
			if h != nil {
				_ = h.Close(t.Context())
			}
			require.ErrorIs(t, err, ErrTemplateExceeded)
			var te *TemplateError
			require.True(t, errors.As(err, &te))
			assert.Equal(t, limit, te.Limit)
			assert.Equal(t, source, te.Template)
			assert.Contains(t, err.Error(), source)
			assertNoPod(t, b, e, spec.Run.RunID)
		})
	}

	var out lockedbuf.Buffer
	spec := templateSpec("tpl-within")
	h, err := b.Start(t.Context(), spec, small, sandbox.Streams{Stdout: &out})
	require.NoError(t, err, "a run asking less than the template is honoured")
	defer h.Close(t.Context())
	res := h.Wait(t.Context())
	require.True(t, res.Succeeded(), "%+v", res)
	assert.Equal(t, "ok\n", out.String())
	pod, err := cs.CoreV1().Pods(e.namespace).Get(t.Context(), h.ID(), metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, pod.Spec.RuntimeClassName)
	assert.Equal(t, class, *pod.Spec.RuntimeClassName, "the template fixes the RuntimeClass")
	for _, c := range pod.Spec.Containers {
		if c.Name == ContainerRun {
			assert.Equal(t, int64(128<<20), c.Resources.Limits.Memory().Value(), "the smaller ask is kept")
			assert.Equal(t, int64(250), c.Resources.Limits.Cpu().MilliValue())
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == VolumeData {
			require.NotNil(t, v.EmptyDir.SizeLimit)
			assert.Equal(t, int64(64<<20), v.EmptyDir.SizeLimit.Value(), "a run without a disk cap gets the template's")
		}
	}
}

// TestUnrestrictedNamespaceIsRefused takes the Pod Security label off the
// runs' namespace: a run there is refused with an error naming the label
// and the fix, and creates nothing; with WithAllowUnrestrictedNamespace
// the run goes ahead, and a warning is logged.
func TestUnrestrictedNamespaceIsRefused(t *testing.T) {
	e := requireCluster(t)
	cs := e.cluster.Client
	ns, err := cs.CoreV1().Namespaces().Get(t.Context(), e.namespace, metav1.GetOptions{})
	require.NoError(t, err)
	delete(ns.Labels, LabelPodSecurityEnforce)
	_, err = cs.CoreV1().Namespaces().Update(t.Context(), ns, metav1.UpdateOptions{})
	require.NoError(t, err)

	b := newTestBackend(t, e)
	spec := templateSpec("unrestricted")
	h, err := b.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{})
	if h != nil {
		_ = h.Close(t.Context())
	}
	require.ErrorIs(t, err, ErrUnrestrictedNamespace)
	assert.Contains(t, err.Error(), LabelPodSecurityEnforce+"=restricted")
	assert.Contains(t, err.Error(), "--allow-unrestricted-namespace")
	assertNoPod(t, b, e, spec.Run.RunID)

	var logs, out lockedbuf.Buffer
	allowed := newTestBackend(t, e, WithAllowUnrestrictedNamespace(true),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	h, err = allowed.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{Stdout: &out})
	require.NoError(t, err, "the operator allowed the unrestricted namespace")
	defer h.Close(t.Context())
	res := h.Wait(t.Context())
	require.True(t, res.Succeeded(), "%+v", res)
	assert.Equal(t, "ok\n", out.String())
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "allow-unrestricted-namespace")
}
