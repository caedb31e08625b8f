// Package kubernetes implements sandbox.Backend on a Kubernetes cluster:
// one Pod per run, behind the same contract as sandbox/docker.
//
// A run's Pod passes the Pod Security "restricted" profile (see convert.go)
// and has three containers, all confined alike:
//
//   - fill, an init container of the helper image, receives the Spec's
//     mounts from the executor as a fill stream over attach stdin and
//     extracts them into an emptyDir, the data volume; it also copies the
//     helper program into a second emptyDir;
//   - run, the Spec's image, starts the helper's gate, which holds the
//     command until the executor is attached to the container's output (it
//     releases the gate with one byte on stdin), and holds the container's
//     exit until the executor acknowledged every byte of that output on the
//     same stdin (podhelper's ack.go), so no byte is lost, however far the
//     executor's reader lags;
//   - keep, of the helper image, keeps the Pod and its data volume alive
//     after the run container exited, until the executor has copied the
//     read-write mounts back over exec and deleted the Pod.
//
// A NetworkPolicy denying all ingress and egress selects the run's Pod
// alone; the Pod owns it (an owner reference), so whoever deletes the Pod,
// the cluster's garbage collector deletes the policy. The Pod is owned in
// turn by the run's Lease (lease.go), which the executor renews while it
// holds the run: once the executor is gone (killed, or cut from the API
// server) the Lease expires, and any executor's Reap deletes the run; the
// garbage collector deletes the Pod of a deleted Lease. Timeouts and cancellation stop the run container with SIGTERM and,
// after the grace period, SIGKILL (exec of the helper's stop); the Pod's
// activeDeadlineSeconds is a backstop the cluster enforces when the executor
// is gone, and Reap removes such Pods by label.
package kubernetes

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/taskrun/taskrun/sandbox"
)

// Defaults of the backend's options.
const (
	// DefaultHelperImage is the helper image (taskrun images build builds it).
	DefaultHelperImage = "taskrun/podhelper:local"
	// DefaultStopGrace is the SIGTERM-to-SIGKILL grace when a Spec sets none.
	DefaultStopGrace = 10 * time.Second
	// DefaultExpirySlack is added to timeout and grace in the expiry
	// annotation and the Pod's active deadline.
	DefaultExpirySlack = 5 * time.Minute
	// DefaultDiskBytes caps the data volume (the run's mounts).
	DefaultDiskBytes = 1 << 30
	// DefaultLogBytes is the ephemeral storage allowed for the run
	// container's log.
	DefaultLogBytes = 64 << 20
	// DefaultStartTimeout bounds how long Start waits for the Pod to be
	// scheduled and its containers to start.
	DefaultStartTimeout = 2 * time.Minute
	// cleanupTimeout bounds calls made on a context detached from the
	// caller's.
	cleanupTimeout = 30 * time.Second
)

// Backend runs sandbox Pods in one namespace. It is safe for concurrent use.
type Backend struct {
	client           *client
	config           *rest.Config
	namespace        string
	log              *slog.Logger
	helperImage      string
	runtimeClasses   map[string]string
	seccompLocalhost string
	diskBytes        int64
	logBytes         int64
	cpuRequest       resource.Quantity
	memoryRequest    resource.Quantity
	stopGrace        time.Duration
	expirySlack      time.Duration
	startTimeout     time.Duration
	ackIdle          time.Duration
	apiOutage        time.Duration
	leaseDuration    time.Duration
	reachProbes      []sandbox.ReachTarget
	kubelet          int
	instance         string
	instanceProcess  string
	host             string
	now              func() time.Time
	// allowUnrestricted lets runs start in a namespace that does not
	// enforce Pod Security "restricted" (with a warning).
	allowUnrestricted bool

	mu   sync.Mutex
	live map[string]*handle
	// lastReap is when reapExpired last ran.
	lastReap time.Time
}

// Option configures a Backend.
type Option func(*Backend)

// WithLogger sets the logger; the default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(b *Backend) { b.log = l } }

// WithHelperImage sets the helper image of the fill and keeper containers.
func WithHelperImage(ref string) Option { return func(b *Backend) { b.helperImage = ref } }

// WithRuntimeClass maps a Policy.Runtime (such as "runsc") to the cluster's
// RuntimeClass name (such as "gvisor"). A Policy naming a runtime without a
// mapping is refused.
func WithRuntimeClass(runtime, class string) Option {
	return func(b *Backend) { b.runtimeClasses[runtime] = class }
}

// WithSeccompLocalhost selects taskrun's seccomp profile installed on the
// nodes at path (relative to the kubelet's seccomp directory) instead of the
// runtime's default profile.
func WithSeccompLocalhost(path string) Option { return func(b *Backend) { b.seccompLocalhost = path } }

// WithDiskBytes caps the data volume holding the run's mounts.
func WithDiskBytes(n int64) Option { return func(b *Backend) { b.diskBytes = n } }

// WithRequests sets the run container's CPU and memory requests (what the
// scheduler reserves; the Policy sets the limits).
func WithRequests(cpu, memory resource.Quantity) Option {
	return func(b *Backend) { b.cpuRequest, b.memoryRequest = cpu, memory }
}

// WithStopGrace sets the grace period used when a Spec sets no StopGrace.
func WithStopGrace(d time.Duration) Option { return func(b *Backend) { b.stopGrace = d } }

// WithExpirySlack sets the margin added to timeout and grace in the expiry
// annotation and the Pod's active deadline. It never goes below what the
// executor may spend on a run around its timeout (start timeout, stop
// grace, API server outage bound).
func WithExpirySlack(d time.Duration) Option { return func(b *Backend) { b.expirySlack = d } }

// WithStartTimeout bounds how long Start waits for the Pod to start.
func WithStartTimeout(d time.Duration) Option { return func(b *Backend) { b.startTimeout = d } }

// WithAckIdle sets how long the run container's gate, once the command
// exited, waits for the executor's acknowledgement of its output while
// nothing moves (default podhelper.DefaultAckIdle). Past it the container
// exits and the run's Result reports ErrOutputIncomplete.
func WithAckIdle(d time.Duration) Option { return func(b *Backend) { b.ackIdle = d } }

// WithAPIOutage sets how long a run rides out an API server that does not
// answer (default DefaultAPIOutage): its Pod's status reads and deletion
// are retried with a bounded backoff until then, and past it the run ends
// with an error wrapping ErrAPIServerUnreachable.
func WithAPIOutage(d time.Duration) Option { return func(b *Backend) { b.apiOutage = d } }

// WithLeaseDuration sets the duration of each run's Lease, the object that
// owns its Pod (default DefaultLeaseDuration, at least 3s): the executor
// renews it every third of that while it holds the run, and once it has
// expired any executor's reaper (taskrun gc --namespace, the start of a
// run or worker) removes the run's Lease, Pod and NetworkPolicy.
func WithLeaseDuration(d time.Duration) Option {
	return func(b *Backend) { b.leaseDuration = max(d, minLeaseDuration) }
}

// WithInstance labels every Pod with the executor's instance ID
// (sandbox.LabelInstance), so that Reap run by another executor leaves them
// alone while this one lives.
func WithInstance(id string) Option { return func(b *Backend) { b.instance = id } }

// WithInstanceProcess records the executor's process record
// (instance.Info.Process) and this host's name on every Pod, so that once
// the executor has exited, even cleanly (its lock file removed), a reaper on
// the same host proves it gone and removes Pods it left behind (Reap's
// ExecutorGone).
func WithInstanceProcess(process string) Option {
	return func(b *Backend) { b.instanceProcess = process }
}

// WithAllowUnrestrictedNamespace lets runs start in a namespace whose
// pod-security.kubernetes.io/enforce label is not "restricted" (or that the
// executor may not read), logging a warning at each run; by default such a
// run is refused with ErrUnrestrictedNamespace.
func WithAllowUnrestrictedNamespace(allow bool) Option {
	return func(b *Backend) { b.allowUnrestricted = allow }
}

// WithClock sets the backend's clock (creation annotations, reaper ages).
func WithClock(now func() time.Time) Option { return func(b *Backend) { b.now = now } }

// Instance returns the executor instance ID the backend labels Pods with.
func (b *Backend) Instance() string { return b.instance }

// Kind names the backend's kind (sandbox.Kinder): the audit evaluates its
// Pods on the rules as Kubernetes enforces them.
func (b *Backend) Kind() string { return sandbox.BackendKubernetes }

// Namespace returns the namespace the backend runs Pods in.
func (b *Backend) Namespace() string { return b.namespace }

// ConfigFromKubeconfig loads a client configuration from the kubeconfig
// file at path ("" for the usual KUBECONFIG and ~/.kube/config lookup).
func ConfigFromKubeconfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %q: %w; pass --kubeconfig PATH to a cluster's kubeconfig", path, err)
	}
	return cfg, nil
}

// New connects to the cluster with cfg and checks that the namespace
// exists. When the API server does not answer, the error wraps
// sandbox.ErrDaemonUnavailable.
func New(ctx context.Context, cfg *rest.Config, namespace string, opts ...Option) (*Backend, error) {
	if namespace == "" {
		return nil, errors.New("kubernetes backend: namespace is empty; pass --namespace NS (a namespace enforcing Pod Security \"restricted\")")
	}
	client, err := newClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	b := &Backend{
		client:         client,
		config:         cfg,
		namespace:      namespace,
		log:            slog.Default(),
		helperImage:    DefaultHelperImage,
		diskBytes:      DefaultDiskBytes,
		logBytes:       DefaultLogBytes,
		cpuRequest:     resource.MustParse("50m"),
		memoryRequest:  resource.MustParse("64Mi"),
		stopGrace:      DefaultStopGrace,
		expirySlack:    DefaultExpirySlack,
		startTimeout:   DefaultStartTimeout,
		apiOutage:      DefaultAPIOutage,
		leaseDuration:  DefaultLeaseDuration,
		runtimeClasses: map[string]string{},
		now:            time.Now,
		live:           map[string]*handle{},
	}
	for _, o := range opts {
		o(b)
	}
	// The host name scopes process records: this backend writes them on its
	// Pods and reads them back only from Pods created on this host.
	if b.host, err = os.Hostname(); err != nil {
		b.log.Warn("no host name: pods carry no process record of their executor", "err", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := client.namespaces().Get(pctx, namespace); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubernetes backend: namespace %q does not exist: %w; create it with Pod Security \"restricted\" enforced", namespace, err)
		}
		if apierrors.IsForbidden(err) {
			// A namespaced role may not read namespaces; the run calls decide.
			return b, nil
		}
		return nil, fmt.Errorf("%w: API server %s: %w; check --kubeconfig", sandbox.ErrDaemonUnavailable, cfg.Host, err)
	}
	return b, nil
}

// Start creates the run's Pod and the NetworkPolicy it owns, fills the mounts, attaches
// to the run container and releases its gate. On error nothing is left
// behind.
func (b *Backend) Start(ctx context.Context, spec sandbox.Spec, pol sandbox.Policy, streams sandbox.Streams) (sandbox.Handle, error) {
	if err := pol.Validate(); err != nil {
		return nil, err
	}
	if spec.Image == "" {
		return nil, errors.New("sandbox spec: image is empty; set Spec.Image to an image loaded on the cluster's nodes")
	}
	if spec.RestoreFrom != "" {
		return nil, fmt.Errorf("sandbox spec: restore from %s: %w on Kubernetes (containerd's CRI has no checkpoint call)", spec.RestoreFrom, sandbox.ErrCheckpointUnsupported)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if spec.StopGrace <= 0 {
		spec.StopGrace = b.stopGrace
	}
	class := ""
	if pol.Runtime != "" {
		var ok bool
		if class, ok = b.runtimeClasses[pol.Runtime]; !ok {
			return nil, fmt.Errorf("sandbox policy: runtime %q has no RuntimeClass on this cluster; configure one (e.g. --runtime-class %s=gvisor)", pol.Runtime, pol.Runtime)
		}
	}
	if err := b.checkNamespace(ctx); err != nil {
		return nil, err
	}
	tpl, err := b.template(ctx)
	if err != nil {
		return nil, err
	}
	// A run without its own disk cap gets the backend's, or the template's
	// when that is smaller.
	disk := spec.DiskBytes
	if disk == 0 && (tpl == nil || tpl.DiskBytes == 0 || b.diskBytes <= tpl.DiskBytes) {
		disk = b.diskBytes
	}
	merged, err := MergeTemplate(tpl, Request{
		RuntimeClass: class,
		MemoryBytes:  pol.MemoryBytes,
		MilliCPUs:    pol.NanoCPUs / 1_000_000,
		PidsLimit:    pol.PidsLimit,
		DiskBytes:    disk,
		Timeout:      spec.Timeout,
		Egress:       spec.Labels[sandbox.LabelEgress] != "",
	})
	if err != nil {
		return nil, err
	}
	class, spec.DiskBytes = merged.RuntimeClass, merged.DiskBytes
	sockets, err := findSockets(spec.Mounts)
	if err != nil {
		return nil, fmt.Errorf("look for the executor's sockets in the mounts: %w", err)
	}
	cfg := b.podConfig(spec, class, b.now())
	for _, s := range sockets {
		cfg.Sockets = append(cfg.Sockets, s.Pod)
	}
	cv, err := convert(spec, pol, cfg)
	if err != nil {
		return nil, err
	}
	h := newHandle(b, cv.Pod.Name, spec, streams)
	if err := h.start(ctx, cv, sockets); err != nil {
		h.discard(ctx)
		return nil, err
	}
	b.register(h)
	b.log.DebugContext(ctx, "sandbox pod started", "pod", h.name, "run", spec.Run.RunID, "image", spec.Image)
	return h, nil
}

// ErrUnrestrictedNamespace is wrapped by the error of a run refused because
// its namespace does not enforce Pod Security "restricted".
var ErrUnrestrictedNamespace = errors.New(`namespace does not enforce Pod Security "restricted"`)

// checkNamespace refuses a run in a namespace whose Pod Security
// enforcement is not "restricted" (or cannot be read), unless the operator
// allowed it: then it logs a warning.
func (b *Backend) checkNamespace(ctx context.Context) error {
	var ns *corev1.Namespace
	err := b.retryAPI(ctx, "get namespace "+b.namespace, func(ctx context.Context) error {
		var err error
		ns, err = b.client.namespaces().Get(ctx, b.namespace)
		return err
	})
	level := ""
	switch {
	case apierrors.IsForbidden(err):
		level = "unknown (the executor may not get the namespace)"
	case err != nil:
		return fmt.Errorf("get namespace %s: %w", b.namespace, err)
	default:
		if level = ns.Labels[LabelPodSecurityEnforce]; level == "restricted" {
			return nil
		}
		if level == "" {
			level = "unset"
		}
	}
	if b.allowUnrestricted {
		b.log.WarnContext(ctx, "running in a namespace that does not enforce Pod Security restricted, as --allow-unrestricted-namespace allows",
			"namespace", b.namespace, "label", LabelPodSecurityEnforce, "level", level)
		return nil
	}
	return fmt.Errorf("%w: namespace %s has %s=%s; label it (kubectl label namespace %s %s=restricted), or pass --allow-unrestricted-namespace to run there anyway",
		ErrUnrestrictedNamespace, b.namespace, LabelPodSecurityEnforce, level, b.namespace, LabelPodSecurityEnforce)
}

// podConfig is the converter's input from the backend's options.
func (b *Backend) podConfig(spec sandbox.Spec, runtimeClass string, created time.Time) podConfig {
	return podConfig{
		Namespace:        b.namespace,
		Name:             podName(spec.Name, strings.ToLower(rand.Text()[:8])),
		HelperImage:      b.helperImage,
		RuntimeClass:     runtimeClass,
		SeccompLocalhost: b.seccompLocalhost,
		DiskBytes:        b.dataVolumeBytes(spec),
		LogBytes:         b.logBytes,
		CPURequest:       b.cpuRequest,
		MemoryRequest:    b.memoryRequest,
		Instance:         b.instance,
		InstanceProcess:  b.instanceProcess,
		InstanceHost:     b.host,
		Created:          created,
		Slack:            b.slack(spec),
		AckIdle:          b.ackIdle,
		LeaseDuration:    b.leaseDuration,
	}
}

// slack is the margin of a run's deadline past its timeout and grace: the
// backend's expiry slack, but never less than what the executor itself may
// still spend on the run around its timeout (starting the Pod, stopping the
// command, waiting out an API server outage, copying the mounts out), so
// neither the cluster's active deadline nor the reaper ends a Pod its
// executor is still within its bounds to finish.
func (b *Backend) slack(spec sandbox.Spec) time.Duration {
	grace := spec.StopGrace
	if grace <= 0 {
		grace = b.stopGrace
	}
	own := b.startTimeout + 2*grace + 3*cleanupTimeout + b.apiOutage
	return max(b.expirySlack, own)
}

// dataVolumeBytes is the size of the data volume of a Pod running spec: the
// run's own disk cap when it has one, else the backend's (WithDiskBytes).
func (b *Backend) dataVolumeBytes(spec sandbox.Spec) int64 {
	if spec.DiskBytes > 0 {
		return spec.DiskBytes
	}
	return b.diskBytes
}

// HostFacts describes the cluster (sandbox.EngineDescriber): its version and
// the RuntimeClasses the backend maps runtimes to.
func (b *Backend) HostFacts(ctx context.Context) (sandbox.HostFacts, error) {
	v, err := b.client.serverVersion(ctx)
	if err != nil {
		return sandbox.HostFacts{}, fmt.Errorf("kubernetes server version: %w", err)
	}
	facts := sandbox.HostFacts{Seccomp: true, ServerVersion: v.GitVersion}
	for rt := range b.runtimeClasses {
		facts.Runtimes = append(facts.Runtimes, rt)
	}
	return facts, nil
}

// register records a live handle; the reaper never touches its Pod.
func (b *Backend) register(h *handle) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.live[h.name] = h
}

// unregister forgets a handle.
func (b *Backend) unregister(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.live, name)
}

// isLive reports whether this backend holds a handle for the Pod.
func (b *Backend) isLive(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.live[name]
	return ok
}

// deleteRun deletes the run's Pod (at once: its outputs are out or given
// up), NetworkPolicy and Lease, on a context detached from ctx's cancellation,
// riding out an API server outage up to the backend's bound. What is
// already gone is not an error; what could not be deleted is logged as left
// for the reaper.
func (b *Backend) deleteRun(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.apiOutage+cleanupTimeout)
	defer cancel()
	zero := int64(0)
	bg := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{GracePeriodSeconds: &zero, PropagationPolicy: &bg}
	var errs []error
	if err := b.retryAPI(ctx, "delete pod "+name, func(ctx context.Context) error {
		return b.client.pods(b.namespace).Delete(ctx, name, opts)
	}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete pod %s: %w", name, err))
	}
	if err := b.retryAPI(ctx, "delete network policy "+name, func(ctx context.Context) error {
		return b.client.networkPolicies(b.namespace).Delete(ctx, name, opts)
	}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete network policy %s: %w", name, err))
	}
	// The Lease last: deleting it first would have the garbage collector
	// delete the Pod, with a grace period this call does not choose.
	if err := b.retryAPI(ctx, "delete lease "+name, func(ctx context.Context) error {
		return b.client.leases(b.namespace).Delete(ctx, name, opts)
	}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete lease %s: %w", name, err))
	}
	err := errors.Join(errs...)
	if err != nil {
		b.log.Warn("run pod left for the reaper: once its lease expires, the next taskrun run, worker start or taskrun gc --namespace reaps it; the cluster stops it at its active deadline",
			"pod", name, "namespace", b.namespace, "executor", b.instance, "err", err)
	}
	return err
}

// containerStatus finds a container's status in a Pod's status.
func containerStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

var (
	_ sandbox.Backend         = (*Backend)(nil)
	_ sandbox.EngineDescriber = (*Backend)(nil)
)

// Capabilities states what the Kubernetes backend does beyond
// sandbox.Backend (sandbox.Capable). A Pod gets a copy of the run
// directory, not a shared one (no hold); it has a network interface by
// design, which its NetworkPolicy confines (the self-check neither expects
// none nor dials out); no per-Pod pids limit exists (a declared gap); and
// it mounts no service account token, which the self-check verifies.
// It samples no resource usage (Stats false): a Pod's cgroup figures are
// only on its node, through the kubelet's stats summary or a metrics
// server, which the backend does not reach; a run's record then has no
// usage.
//
// Its network is not taken on trust: the self-check connects from the run
// container to the node's kubelet (the node's address from the Downward
// API, in EnvNodeIP) and to each WithReachProbe address, and fails the run
// if one connects.
func (b *Backend) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{
		Kind:             sandbox.BackendKubernetes,
		DescribesHost:    true,
		OwnNetwork:       true,
		NoServiceAccount: true,
		Unreachable: append([]sandbox.ReachTarget{{Name: "node kubelet", HostEnv: EnvNodeIP, Port: b.kubeletPort()}},
			b.reachProbes...),
	}
}

// EnvNodeIP is the run container's variable holding its node's address
// (the Downward API's status.hostIP).
const EnvNodeIP = "TASKRUN_NODE_IP"

// KubeletPort is the kubelet's usual API port, which the self-check probes
// on the node unless WithKubeletPort says another.
const KubeletPort = 10250

// WithKubeletPort sets the port the nodes' kubelets listen on (their Node
// status's daemonEndpoints), which the self-check probes from every run.
func WithKubeletPort(port int) Option { return func(b *Backend) { b.kubelet = port } }

// kubeletPort is the kubelet port the self-check probes.
func (b *Backend) kubeletPort() int {
	if b.kubelet > 0 {
		return b.kubelet
	}
	return KubeletPort
}

// WithReachProbe adds an address the run's Pod must not reach (a canary Pod
// or Service in the namespace, another node): the self-check connects to
// host:port from every run and fails the run if it connects.
func WithReachProbe(name, host string, port int) Option {
	return func(b *Backend) {
		b.reachProbes = append(b.reachProbes, sandbox.ReachTarget{Name: name, Host: host, Port: port})
	}
}
