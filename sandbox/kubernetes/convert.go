package kubernetes

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/taskrun/taskrun/helpers/podhelper"
	"github.com/taskrun/taskrun/sandbox"
)

// Names of the Pod's containers and volumes.
const (
	// ContainerRun runs the Spec's command behind the gate.
	ContainerRun = "run"
	// ContainerFill is the init container that receives the mounts.
	ContainerFill = "fill"
	// ContainerKeep keeps the Pod alive for the outputs to be copied out.
	ContainerKeep = "keep"
	// VolumeData holds the run's mounts, one entry per Spec mount.
	VolumeData = "taskrun-data"
	// VolumeBin holds the helper, copied there by the fill container.
	VolumeBin = "taskrun-bin"
	// VolumeTunnel holds the keeper's tunnel control socket; only the
	// keeper mounts it.
	VolumeTunnel = "taskrun-tunnel"
	// VolumeTmp is the size-capped writable /tmp.
	VolumeTmp = "tmp"
	// TmpPath is where VolumeTmp is mounted in the run container.
	TmpPath = "/tmp"
	// LabelPod holds the Pod's own name, so the run's NetworkPolicy selects
	// exactly it.
	LabelPod = sandbox.LabelPod
	// LabelInstanceHost holds the host name of the executor that created
	// the Pod: its process record (sandbox.LabelInstanceProcess) proves it
	// gone only on that host.
	LabelInstanceHost = "dev.taskrun.instance-host"
)

// podConfig is what the converter needs besides the Spec and Policy: the
// backend's options and the values a pure function cannot make up.
type podConfig struct {
	Namespace   string
	Name        string
	HelperImage string
	// RuntimeClass is the RuntimeClass of Policy.Runtime ("" for none).
	RuntimeClass string
	// SeccompLocalhost is the node-relative path of taskrun's seccomp
	// profile; "" selects RuntimeDefault.
	SeccompLocalhost string
	// DiskBytes caps the data volume and, with LogBytes, the run
	// container's ephemeral storage.
	DiskBytes int64
	// LogBytes is the ephemeral storage allowed for the container's log.
	LogBytes int64
	// CPURequest and MemoryRequest are the run container's requests (capped
	// by its limits); the helper containers request HelperCPU/HelperMemory.
	CPURequest    resource.Quantity
	MemoryRequest resource.Quantity
	Instance      string
	// InstanceProcess and InstanceHost are the creating executor's process
	// record and host name; "" leaves them out.
	InstanceProcess string
	InstanceHost    string
	Created         time.Time
	// Slack is added to the run's timeout and grace in its deadline
	// (runDeadline): it covers what the executor itself may spend around
	// the run (Backend.slack).
	Slack time.Duration
	// Sockets are the data volume paths the keeper serves through the
	// model tunnel.
	Sockets []string
	// AckIdle bounds the gate's wait for the executor's acknowledgements
	// without progress; 0 keeps the gate's default.
	AckIdle time.Duration
	// LeaseDuration is the duration of the run's Lease (0: the default).
	LeaseDuration time.Duration
}

// Helper containers' resources: small and fixed.
var (
	helperCPURequest     = resource.MustParse("10m")
	helperCPULimit       = resource.MustParse("500m")
	helperMemoryRequest  = resource.MustParse("16Mi")
	helperMemoryLimit    = resource.MustParse("128Mi")
	helperStorageLimit   = resource.MustParse("16Mi")
	helperStorageRequest = resource.MustParse("1Mi")
	storageRequest       = resource.MustParse("64Mi")
	binVolumeLimit       = resource.MustParse("256Mi")
	tunnelVolumeLimit    = resource.MustParse("1Mi")
)

// converted is what one run creates in the cluster.
type converted struct {
	// Lease owns the Pod, which owns the NetworkPolicy.
	Lease         *coordinationv1.Lease
	Pod           *corev1.Pod
	NetworkPolicy *networkingv1.NetworkPolicy
}

// convert maps a Spec and Policy to the run's Lease, Pod and NetworkPolicy. It is
// pure. spec.StopGrace must already hold the effective grace period.
func convert(spec sandbox.Spec, pol sandbox.Policy, cfg podConfig) (converted, error) {
	uid, gid, err := parseUser(pol.User)
	if err != nil {
		return converted{}, err
	}
	argv, err := command(spec)
	if err != nil {
		return converted{}, err
	}
	labels, annotations, err := metadata(spec, cfg)
	if err != nil {
		return converted{}, err
	}
	mounts, err := runMounts(spec.Mounts)
	if err != nil {
		return converted{}, err
	}
	env, err := envVars(spec.Env)
	if err != nil {
		return converted{}, err
	}
	// The node's address, which only the cluster knows once the Pod is
	// scheduled: the self-check probes the node's kubelet there.
	env = append(env, corev1.EnvVar{Name: EnvNodeIP, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}})
	f := false
	t := true
	grace := graceSeconds(spec.StopGrace)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        cfg.Name,
			Namespace:   cfg.Namespace,
			Labels:      labels,
			Annotations: annotations,
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &f,
			EnableServiceLinks:            &f,
			HostNetwork:                   false,
			HostPID:                       false,
			HostIPC:                       false,
			ShareProcessNamespace:         &f,
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &t,
				RunAsUser:      &uid,
				RunAsGroup:     &gid,
				SeccompProfile: seccompProfile(cfg.SeccompLocalhost),
			},
			InitContainers: []corev1.Container{helperContainer(ContainerFill, cfg, podhelper.FillCommand(), true)},
			Containers: []corev1.Container{
				{
					Name:            ContainerRun,
					Image:           spec.Image,
					ImagePullPolicy: corev1.PullNever,
					Command:         escapeExpansion(podhelper.GateCommand(argv, cfg.AckIdle)),
					WorkingDir:      spec.WorkingDir,
					Env:             env,
					Stdin:           true,
					StdinOnce:       true,
					SecurityContext: containerSecurity(pol.ReadOnlyRootfs),
					Resources:       runResources(pol, cfg),
					VolumeMounts: append([]corev1.VolumeMount{
						{Name: VolumeBin, MountPath: podhelper.BinDir, ReadOnly: true},
						{Name: VolumeTmp, MountPath: TmpPath},
					}, mounts...),
					TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				},
				keeperContainer(cfg),
			},
			Volumes: []corev1.Volume{
				{Name: VolumeData, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: quantity(cfg.DiskBytes)}}},
				{Name: VolumeBin, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &binVolumeLimit}}},
				{Name: VolumeTmp, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
					Medium: corev1.StorageMediumMemory, SizeLimit: quantity(pol.TmpfsSizeBytes)}}},
			},
		},
	}
	if len(cfg.Sockets) > 0 {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: VolumeTunnel,
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &tunnelVolumeLimit}}})
	}
	if cfg.RuntimeClass != "" {
		rc := cfg.RuntimeClass
		pod.Spec.RuntimeClassName = &rc
	}
	if spec.Timeout > 0 {
		// A backstop the cluster enforces even when the executor is gone:
		// the executor stops the run at its timeout itself.
		deadline := int64(runDeadline(spec, cfg) / time.Second)
		pod.Spec.ActiveDeadlineSeconds = &deadline
	}
	return converted{Lease: runLease(cfg, labels), Pod: pod, NetworkPolicy: networkPolicy(cfg, labels)}, nil
}

// helperContainer is the fill or keeper container: the helper image, the
// same confinement as the run container, small fixed resources.
func helperContainer(name string, cfg podConfig, cmd []string, stdin bool) corev1.Container {
	return corev1.Container{
		Name:            name,
		Image:           cfg.HelperImage,
		ImagePullPolicy: corev1.PullNever,
		Command:         cmd,
		Stdin:           stdin,
		StdinOnce:       stdin,
		SecurityContext: containerSecurity(true),
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: helperCPURequest, corev1.ResourceMemory: helperMemoryRequest,
				corev1.ResourceEphemeralStorage: helperStorageRequest},
			Limits: corev1.ResourceList{corev1.ResourceCPU: helperCPULimit, corev1.ResourceMemory: helperMemoryLimit,
				corev1.ResourceEphemeralStorage: helperStorageLimit},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: VolumeData, MountPath: podhelper.DataDir},
			{Name: VolumeBin, MountPath: podhelper.BinDir},
		},
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
}

// keeperContainer holds the Pod open and, with sockets, serves them through
// the model tunnel over a control socket in a volume only it mounts.
func keeperContainer(cfg podConfig) corev1.Container {
	c := helperContainer(ContainerKeep, cfg, podhelper.HoldCommand(cfg.Sockets...), false)
	if len(cfg.Sockets) > 0 {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: VolumeTunnel, MountPath: podhelper.TunnelDir})
	}
	return c
}

// containerSecurity is every container's security context: no privilege
// escalation, no capability, no privileged mode, the default /proc masks.
func containerSecurity(readOnlyRoot bool) *corev1.SecurityContext {
	f := false
	ro := readOnlyRoot
	pm := corev1.DefaultProcMount
	return &corev1.SecurityContext{
		Privileged:               &f,
		AllowPrivilegeEscalation: &f,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		ReadOnlyRootFilesystem:   &ro,
		ProcMount:                &pm,
	}
}

// seccompProfile is taskrun's Localhost profile when the node has it, else
// the runtime's default.
func seccompProfile(localhost string) *corev1.SeccompProfile {
	if localhost == "" {
		return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	p := localhost
	return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &p}
}

// runResources are the run container's limits from the Policy and its
// requests from the backend's options, capped by the limits.
func runResources(pol sandbox.Policy, cfg podConfig) corev1.ResourceRequirements {
	cpu := *resource.NewMilliQuantity((pol.NanoCPUs+999_999)/1_000_000, resource.DecimalSI)
	mem := *resource.NewQuantity(pol.MemoryBytes, resource.BinarySI)
	storage := *resource.NewQuantity(cfg.DiskBytes+cfg.LogBytes+pol.TmpfsSizeBytes, resource.BinarySI)
	reqCPU, reqMem := cfg.CPURequest, cfg.MemoryRequest
	if reqCPU.Cmp(cpu) > 0 {
		reqCPU = cpu
	}
	if reqMem.Cmp(mem) > 0 {
		reqMem = mem
	}
	return corev1.ResourceRequirements{
		// An ephemeral-storage request left out would default to the limit
		// and reserve the whole disk cap on the node for every run.
		Requests: corev1.ResourceList{corev1.ResourceCPU: reqCPU, corev1.ResourceMemory: reqMem, corev1.ResourceEphemeralStorage: storageRequest},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem, corev1.ResourceEphemeralStorage: storage},
	}
}

// quantity is n bytes as a quantity, nil for n <= 0.
func quantity(n int64) *resource.Quantity {
	if n <= 0 {
		return nil
	}
	return resource.NewQuantity(n, resource.BinarySI)
}

// networkPolicy denies all ingress and egress of the run's Pod; it carries
// the Pod's labels, so whatever finds the Pod by label finds it too.
func networkPolicy(cfg podConfig, podLabels map[string]string) *networkingv1.NetworkPolicy {
	labels := maps.Clone(podLabels)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Namespace: cfg.Namespace, Labels: labels},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelPod: cfg.Name}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

// runDeadline is how long after its creation a run's Pod may live: the
// Pod's activeDeadlineSeconds, which the cluster enforces, and its
// dev.taskrun.expires annotation, which the reaper reads, are both this,
// in whole seconds (rounded up), so the two never disagree.
func runDeadline(spec sandbox.Spec, cfg podConfig) time.Duration {
	d := spec.Timeout + spec.StopGrace + cfg.Slack
	return (d + time.Second - 1).Truncate(time.Second)
}

// ownedBy is the owner reference that makes a run's other objects (its
// NetworkPolicy) the Pod's: deleting the Pod, by the executor, the reaper or
// anyone, lets the cluster's garbage collector delete them. The Pod is the
// controller of what it owns; blockOwnerDeletion stays unset, as it needs
// update rights on the Pod's finalizers and would only delay the Pod's
// deletion.
func ownedBy(pod *corev1.Pod) metav1.OwnerReference {
	controller := true
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: &controller}
}

// metadata returns the Pod's labels and annotations. Every dev.taskrun.*
// value and every Spec label is an annotation (times and paths are not
// valid label values); those that are valid label values are labels too,
// so the reaper and audits can select by them.
func metadata(spec sandbox.Spec, cfg podConfig) (labels, annotations map[string]string, err error) {
	all := make(map[string]string, len(spec.Labels)+9)
	maps.Copy(all, spec.Labels)
	all[sandbox.LabelManaged] = "true"
	all[sandbox.LabelTenant] = spec.Run.UserID
	all[sandbox.LabelConversation] = spec.Run.ConversationID
	all[sandbox.LabelTask] = spec.Run.TaskID
	all[sandbox.LabelRun] = spec.Run.RunID
	all[sandbox.LabelCreated] = cfg.Created.UTC().Format(time.RFC3339)
	delete(all, sandbox.LabelExpires)
	if spec.Timeout > 0 {
		all[sandbox.LabelExpires] = cfg.Created.Add(runDeadline(spec, cfg)).UTC().Format(time.RFC3339)
	}
	delete(all, sandbox.LabelInstance)
	delete(all, sandbox.LabelInstanceProcess)
	delete(all, LabelInstanceHost)
	if cfg.Instance != "" {
		all[sandbox.LabelInstance] = cfg.Instance
		if cfg.InstanceProcess != "" && cfg.InstanceHost != "" {
			all[sandbox.LabelInstanceProcess] = cfg.InstanceProcess
			all[LabelInstanceHost] = cfg.InstanceHost
		}
	}
	all[LabelPod] = cfg.Name
	labels = map[string]string{}
	annotations = map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(all)) {
		v := all[k]
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, nil, fmt.Errorf("sandbox spec: label key %q is not a valid Kubernetes key: %s", k, strings.Join(errs, "; "))
		}
		annotations[k] = v
		if len(validation.IsValidLabelValue(v)) == 0 {
			labels[k] = v
		}
	}
	if labels[sandbox.LabelManaged] != "true" || labels[LabelPod] != cfg.Name {
		return nil, nil, fmt.Errorf("sandbox spec: Pod name %q is not a valid label value", cfg.Name)
	}
	return labels, annotations, nil
}

// command resolves the argv the gate runs: the Wrapper, then the Spec's
// entrypoint and command. The backend cannot read the image's own
// ENTRYPOINT and CMD (the image lives on the node), so the Spec must name
// the command.
func command(spec sandbox.Spec) ([]string, error) {
	argv := slices.Concat(spec.Wrapper, spec.Entrypoint, spec.Cmd)
	if len(spec.Entrypoint)+len(spec.Cmd) == 0 {
		return nil, fmt.Errorf("sandbox spec: the Kubernetes backend cannot read image %q's own command; give the command to run (after `--`, or RunTaskInput.Command)", spec.Image)
	}
	return argv, nil
}

// runMounts maps the Spec's mounts to subPaths of the data volume: mount i
// is the data volume's entry m<i>, a directory or a file, filled by the
// fill container.
func runMounts(ms []sandbox.Mount) ([]corev1.VolumeMount, error) {
	out := make([]corev1.VolumeMount, 0, len(ms))
	for i, m := range ms {
		if !path.IsAbs(m.Source) || !path.IsAbs(m.Target) {
			return nil, fmt.Errorf("sandbox spec: mount %q -> %q: both paths must be absolute", m.Source, m.Target)
		}
		if path.Clean(m.Target) == podhelper.BinDir || path.Clean(m.Target) == TmpPath {
			return nil, fmt.Errorf("sandbox spec: mount target %q is reserved by the Kubernetes backend", m.Target)
		}
		out = append(out, corev1.VolumeMount{Name: VolumeData, MountPath: m.Target, SubPath: podhelper.SectionName(i), ReadOnly: m.ReadOnly})
	}
	return out, nil
}

// envVars turns KEY=VALUE pairs into the container's environment.
func envVars(env []string) ([]corev1.EnvVar, error) {
	out := make([]corev1.EnvVar, 0, len(env))
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("sandbox spec: environment entry %q is not KEY=VALUE", kv)
		}
		out = append(out, corev1.EnvVar{Name: k, Value: escapeDollars(v)})
	}
	return out, nil
}

// parseUser parses the Policy's numeric uid[:gid]; Kubernetes takes no
// user names.
func parseUser(user string) (uid, gid int64, err error) {
	u, g, hasGroup := strings.Cut(user, ":")
	uid, err = strconv.ParseInt(u, 10, 64)
	if err == nil && hasGroup {
		gid, err = strconv.ParseInt(g, 10, 64)
	} else if err == nil {
		gid = uid
	}
	if err != nil || uid <= 0 || gid < 0 {
		return 0, 0, fmt.Errorf("sandbox policy: user %q must be a numeric non-root uid[:gid] on Kubernetes, such as %s", user, sandbox.DefaultUser)
	}
	return uid, gid, nil
}

// graceSeconds rounds a grace period up to whole seconds, at least one.
func graceSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// podName makes a DNS-1123 name from the Spec's name (or "taskrun") and a
// random suffix: every run gets its own Pod, also for a reused run ID.
func podName(specName, suffix string) string {
	base := strings.ToLower(specName)
	if base == "" {
		base = "taskrun"
	}
	var b strings.Builder
	for _, c := range base {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			b.WriteRune(c)
		default:
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	if name == "" {
		name = "taskrun"
	}
	name = strings.TrimRight(name[:min(len(name), 63-1-len(suffix))], "-")
	return name + "-" + suffix
}

// escapeExpansion escapes every string of a container's command for the
// kubelet, which expands $(VAR) references in command, args and env values
// where the Docker engine passes them as they are.
func escapeExpansion(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = escapeDollars(a)
	}
	return out
}

// escapeDollars doubles each "$": the kubelet reads "$$" as one literal "$",
// so neither "$(VAR)" nor "$$" in the run's own text is rewritten.
func escapeDollars(s string) string { return strings.ReplaceAll(s, "$", "$$") }
