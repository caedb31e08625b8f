// Package kubetest finds the real single-node Kubernetes cluster that
// scripts/kube-up.sh (make kube-up, and make test) starts on this machine, and
// gives tests a client for it and a namespace of their own.
//
// The cluster is found through its admin kubeconfig: TASKRUN_KUBECONFIG, else
// $TASKRUN_KUBE_DIR/kubeconfig, else /tmp/taskrun-kube/kubeconfig. When no
// cluster answers, tests that need it are skipped, unless
// TASKRUN_REQUIRE_KUBE=1 (as in CI), in which case they fail.
//
// Pods in this cluster run only images imported into its containerd
// (scripts/kube-load-image.sh; kube-up imports taskrun/agent:local and
// taskrun/testbox:local when Docker has them) and must say
// imagePullPolicy: Never: nothing is pulled from a registry.
package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	// KubeconfigEnv names the variable holding the admin kubeconfig's path.
	KubeconfigEnv = "TASKRUN_KUBECONFIG"
	// StateDirEnv names the variable holding kube-up's state directory.
	StateDirEnv = "TASKRUN_KUBE_DIR"
	// DefaultStateDir is kube-up's state directory when StateDirEnv is unset.
	DefaultStateDir = "/tmp/taskrun-kube"
	// RequireEnv names the variable that turns a missing cluster from a skip
	// into a failure when set to "1".
	RequireEnv = "TASKRUN_REQUIRE_KUBE"
	// StartCommand starts the cluster.
	StartCommand = "make kube-up"

	// RunsNamespace is the namespace kube-up creates for runs, with the
	// PodSecurity "restricted" level enforced.
	RunsNamespace = "taskrun-runs"
	// NodeName is the cluster's only node.
	NodeName = "taskrun-node"
	// PauseImage is the pod sandbox image kube-up builds and imports.
	PauseImage = "taskrun.local/pause:1"
	// TestboxImage is the static busybox image (make images) kube-up imports.
	TestboxImage = "taskrun/testbox:local"
	// AgentImage is the agent image (make images) kube-up imports.
	AgentImage = "taskrun/agent:local"

	// TestLabel marks the namespaces Namespace creates.
	TestLabel = "dev.taskrun.test"
	// EnforceLabel is the PodSecurity admission label of a namespace.
	EnforceLabel = "pod-security.kubernetes.io/enforce"

	connectTimeout = 10 * time.Second
)

// ErrNoCluster means no test cluster answers at the kubeconfig's address, or
// there is no kubeconfig.
var ErrNoCluster = errors.New("no test cluster is up")

// Cluster is a connection to the test cluster.
type Cluster struct {
	// KubeconfigPath is the admin kubeconfig the connection was made from.
	KubeconfigPath string
	// Config is the admin client configuration (system:masters).
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
}

// KubeconfigPath is where the test cluster's admin kubeconfig is expected.
func KubeconfigPath() string {
	if p := os.Getenv(KubeconfigEnv); p != "" {
		return p
	}
	dir := os.Getenv(StateDirEnv)
	if dir == "" {
		dir = DefaultStateDir
	}
	return filepath.Join(dir, "kubeconfig")
}

// Connect loads the admin kubeconfig and checks that the API server is ready.
// The error wraps ErrNoCluster when there is no kubeconfig or no answer.
func Connect(ctx context.Context) (*Cluster, error) {
	path := KubeconfigPath()
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("%w: %s: %w (start it with %s)", ErrNoCluster, path, err, StartCommand)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", path, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if _, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
		return nil, fmt.Errorf("%w: the API server in %s does not answer: %w (start it with %s)", ErrNoCluster, path, err, StartCommand)
	}
	return &Cluster{KubeconfigPath: path, Config: cfg, Client: client}, nil
}

// Required reports whether RequireEnv asks for the cluster.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Require returns the test cluster, or skips the test when none is up (fails
// it when Required).
func Require(t testing.TB) *Cluster {
	t.Helper()
	c, err := Connect(context.Background())
	if err != nil {
		if errors.Is(err, ErrNoCluster) && !Required() {
			t.Skipf("kubetest: %v", err)
		}
		t.Fatalf("kubetest: %v", err)
	}
	return c
}

// Namespace creates a namespace of its own for the test, with the PodSecurity
// "restricted" level enforced and its default service account in place, and
// deletes it (waiting until its pods are gone) when the test ends.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	name := "test-" + sanitize(t.Name()) + "-" + randomSuffix()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: name,
		Labels: map[string]string{
			EnforceLabel: "restricted",
			"pod-security.kubernetes.io/enforce-version": "latest",
			TestLabel: "true",
		},
	}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := c.DeleteNamespace(context.Background(), name); err != nil {
			t.Errorf("kubetest: %v", err)
		}
	})
	// The controller-manager creates the default service account, which the
	// ServiceAccount admission plugin needs before any pod is admitted.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("kubetest: the default service account of %s: %v", name, err)
	}
	return name
}

// DeleteNamespace deletes a namespace and waits until it is gone, so its pods
// no longer run when it returns.
func (c *Cluster) DeleteNamespace(ctx context.Context, name string) error {
	zero := int64(0)
	policy := metav1.DeletePropagationForeground
	err := c.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero, PropagationPolicy: &policy})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete namespace %s: %w", name, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		return fmt.Errorf("namespace %s is not gone: %w", name, err)
	}
	return nil
}

// RequireImage skips (or, when Required, fails) the test unless the node
// reports ref among its images, that is unless it was imported into the
// cluster's containerd.
func (c *Cluster) RequireImage(t testing.TB, ref string) {
	t.Helper()
	want := map[string]bool{ref: true, "docker.io/" + ref: true, "docker.io/library/" + ref: true}
	// The kubelet reports its images with its node status, every few
	// seconds: an image imported by a kube-up that just finished may not be
	// listed yet.
	deadline := time.Now().Add(imageReportWait)
	for {
		node, err := c.Client.CoreV1().Nodes().Get(context.Background(), NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("kubetest: get node %s: %v", NodeName, err)
		}
		for _, img := range node.Status.Images {
			for _, n := range img.Names {
				if want[n] {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	msg := fmt.Sprintf("kubetest: the cluster has no image %s: build it (make images) and import it (scripts/kube-load-image.sh %s)", ref, ref)
	if Required() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// imageReportWait bounds how long RequireImage waits for the node to list
// an image.
const imageReportWait = 45 * time.Second

// RestrictedPod is a Pod that the PodSecurity "restricted" level admits:
// non-root user 65534, no privilege escalation, every capability dropped, the
// runtime's default seccomp profile, no service account token. It runs image
// (imagePullPolicy Never) with command, once, with small resource requests.
func RestrictedPod(name, image string, command ...string) *corev1.Pod {
	uid := int64(65534)
	yes, no := true, false
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				RunAsUser:      &uid,
				RunAsGroup:     &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           image,
				ImagePullPolicy: corev1.PullNever,
				Command:         command,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{
						corev1.ResourceCPU:    resource.MustParse("10m"),
						corev1.ResourceMemory: resource.MustParse("16Mi"),
					},
					Limits: corev1.ResourceList{
						corev1.ResourceCPU:    resource.MustParse("200m"),
						corev1.ResourceMemory: resource.MustParse("64Mi"),
					},
				},
			}},
		},
	}
}

// WaitPodDone waits until the pod has succeeded or failed and returns it.
func (c *Cluster) WaitPodDone(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	if err != nil {
		return pod, fmt.Errorf("pod %s/%s did not finish: %w", namespace, name, err)
	}
	return pod, nil
}

func sanitize(s string) string {
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	out := strings.Trim(b.String(), "-")
	if len(out) > 40 {
		out = strings.Trim(out[:40], "-")
	}
	return out
}

func randomSuffix() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}
