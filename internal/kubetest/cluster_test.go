package kubetest_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/taskrun/taskrun/internal/kubetest"
)

var cluster *kubetest.Cluster

// TestMain connects once for the package; without a cluster the tests skip
// (or fail under TASKRUN_REQUIRE_KUBE=1) in kubetest.Require.
func TestMain(m *testing.M) {
	if c, err := kubetest.Connect(context.Background()); err == nil {
		cluster = c
	}
	os.Exit(m.Run())
}

func requireCluster(t *testing.T) *kubetest.Cluster {
	t.Helper()
	if cluster != nil {
		return cluster
	}
	return kubetest.Require(t)
}

// A restricted Pod from taskrun/testbox runs to completion as the user its
// security context names, and its output comes back through the API server
// (which fetches it from the kubelet on the node's address).
func TestRestrictedPodRunsAndLogsComeBack(t *testing.T) {
	c := requireCluster(t)
	c.RequireImage(t, kubetest.TestboxImage)
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	token := "kube-" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + ns
	pod := kubetest.RestrictedPod("hello", kubetest.TestboxImage,
		"/bin/sh", "-c", `echo "$0 uid=$(id -u) gid=$(id -g)"`, token)
	_, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)

	done, err := c.WaitPodDone(ctx, ns, "hello")
	require.NoError(t, err)
	require.Equal(t, corev1.PodSucceeded, done.Status.Phase, "pod status: %+v", done.Status)
	require.Equal(t, kubetest.NodeName, done.Spec.NodeName, "the scheduler places it on the only node")

	logs, err := c.Client.CoreV1().Pods(ns).GetLogs("hello", &corev1.PodLogOptions{}).DoRaw(ctx)
	require.NoError(t, err)
	assert.Equal(t, token+" uid=65534 gid=65534\n", string(logs))
}

// The API server's PodSecurity admission refuses, in a namespace enforcing
// "restricted", a Pod with any one field loosened, while it admits the same
// Pod without that change (checked with a server-side dry run, so the refusal
// is due to the field alone).
func TestPodSecurityRefusesLoosenedPod(t *testing.T) {
	c := requireCluster(t)
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods := c.Client.CoreV1().Pods(ns)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	_, err := pods.Create(ctx, kubetest.RestrictedPod("baseline", kubetest.PauseImage), dryRun)
	require.NoError(t, err, "the unloosened pod is admitted")

	yes := true
	root := int64(0)
	cases := []struct {
		name    string
		loosen  func(*corev1.Pod)
		message string
	}{
		{"privileged", func(p *corev1.Pod) {
			// (privileged with allowPrivilegeEscalation=false is invalid.)
			p.Spec.Containers[0].SecurityContext.Privileged = &yes
			p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
		}, `privileged (container "main" must not set securityContext.privileged=true)`},
		{"privilege-escalation", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes
		}, `allowPrivilegeEscalation != false (container "main" must set securityContext.allowPrivilegeEscalation=false)`},
		{"no-run-as-non-root", func(p *corev1.Pod) {
			p.Spec.SecurityContext.RunAsNonRoot = nil
			p.Spec.SecurityContext.RunAsUser = nil
		}, `runAsNonRoot != true`},
		{"run-as-root", func(p *corev1.Pod) {
			p.Spec.SecurityContext.RunAsUser = &root
		}, `runAsUser=0`},
		{"host-network", func(p *corev1.Pod) {
			p.Spec.HostNetwork = true
		}, `host namespaces (hostNetwork=true)`},
		{"capability-kept", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Drop = nil
		}, `unrestricted capabilities (container "main" must set securityContext.capabilities.drop=["ALL"])`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := kubetest.RestrictedPod("loosened-"+tc.name, kubetest.PauseImage)
			tc.loosen(pod)
			_, err := pods.Create(ctx, pod, metav1.CreateOptions{})
			require.Error(t, err, "a loosened pod must be refused")
			assert.True(t, apierrors.IsForbidden(err), "want 403 Forbidden from admission, got %T %v", err, err)
			assert.Contains(t, err.Error(), `violates PodSecurity "restricted:latest"`)
			assert.Contains(t, err.Error(), tc.message)
			_, getErr := pods.Get(ctx, pod.Name, metav1.GetOptions{})
			assert.True(t, apierrors.IsNotFound(getErr), "the refused pod must not exist: %v", getErr)
		})
	}
}
