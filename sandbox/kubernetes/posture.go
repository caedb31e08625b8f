package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/taskrun/taskrun/sandbox"
)

// ErrNoRunContainer is returned by PostureFromPod for a Pod without the run
// container.
var ErrNoRunContainer = errors.New("pod has no run container")

// Network modes a Pod's posture reports.
const (
	// NetworkPod is a Pod's own network namespace.
	NetworkPod = "pod"
	// NetworkHost is the node's network namespace (hostNetwork).
	NetworkHost = "host"
)

// PostureFromPod extracts the run container's posture from its Pod; the
// one place a Pod becomes facts. Kubernetes sets no pids or open-files
// limit per Pod, so PidsLimit is nil and Ulimits empty; swap follows the
// node's swap behaviour, which the Pod does not say, so MemorySwap equals
// Memory (no swap, the kubelet's default).
func PostureFromPod(pod *corev1.Pod) (sandbox.Posture, error) {
	var run *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == ContainerRun {
			run = &pod.Spec.Containers[i]
		}
	}
	if run == nil {
		return sandbox.Posture{}, fmt.Errorf("%w: %s", ErrNoRunContainer, pod.Name)
	}
	psc := pod.Spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	csc := run.SecurityContext
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	labels := maps.Clone(pod.Annotations)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, pod.Labels)
	p := sandbox.Posture{
		Backend:       sandbox.BackendKubernetes,
		ID:            pod.Name,
		Name:          pod.Name,
		Image:         run.Image,
		Labels:        labels,
		User:          user(psc, csc),
		WorkingDir:    run.WorkingDir,
		Privileged:    csc.Privileged != nil && *csc.Privileged,
		NetworkMode:   NetworkPod,
		PidMode:       "private",
		IpcMode:       "private",
		RestartPolicy: restartPolicy(pod.Spec.RestartPolicy),
		LogDriver:     "kubelet",
	}
	if st := containerStatus(pod, ContainerRun); st != nil && st.ContainerID != "" {
		p.ID = st.ContainerID
	}
	if pod.Spec.HostNetwork {
		p.NetworkMode = NetworkHost
	}
	if pod.Spec.HostPID {
		p.PidMode = "host"
	}
	if pod.Spec.HostIPC {
		p.IpcMode = "host"
	}
	if pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers {
		p.UsernsMode = "private"
	}
	if csc.Capabilities != nil {
		for _, c := range csc.Capabilities.Add {
			p.CapAdd = append(p.CapAdd, string(c))
		}
		for _, c := range csc.Capabilities.Drop {
			p.CapDrop = append(p.CapDrop, string(c))
		}
	}
	if csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation {
		p.SecurityOpt = append(p.SecurityOpt, "no-new-privileges")
	}
	if sp := seccomp(psc, csc); sp != "" {
		p.SecurityOpt = append(p.SecurityOpt, "seccomp="+sp)
	}
	if csc.AppArmorProfile != nil {
		p.AppArmorProfile = string(csc.AppArmorProfile.Type)
	} else if psc.AppArmorProfile != nil {
		p.AppArmorProfile = string(psc.AppArmorProfile.Type)
	}
	p.ReadonlyRootfs = csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem
	if m, ok := run.Resources.Limits[corev1.ResourceMemory]; ok {
		p.Memory = m.Value()
		p.MemorySwap = p.Memory
	}
	if e, ok := run.Resources.Limits[corev1.ResourceEphemeralStorage]; ok {
		p.EphemeralStorage = e.Value()
	}
	p.ServiceAccountToken = pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken
	if c, ok := run.Resources.Limits[corev1.ResourceCPU]; ok {
		p.NanoCPUs = c.MilliValue() * 1_000_000
	}
	if pod.Spec.RuntimeClassName != nil {
		p.Runtime = *pod.Spec.RuntimeClassName
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	for _, vm := range run.VolumeMounts {
		v := volumes[vm.Name]
		m := sandbox.PostureMount{Type: "volume", Source: vm.Name, Destination: vm.MountPath, RW: !vm.ReadOnly}
		switch {
		case v.HostPath != nil:
			m.Type, m.Source = "bind", v.HostPath.Path
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil {
					p.ServiceAccountToken = true
				}
			}
		case v.EmptyDir != nil && v.EmptyDir.Medium != corev1.StorageMediumMemory:
			m.Type = "emptyDir"
		case v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory:
			if p.Tmpfs == nil {
				p.Tmpfs = map[string]string{}
			}
			opts := "rw"
			if v.EmptyDir.SizeLimit != nil {
				opts += ",size=" + strconv.FormatInt(v.EmptyDir.SizeLimit.Value(), 10)
			}
			p.Tmpfs[vm.MountPath] = opts
			continue
		}
		if vm.SubPath != "" {
			m.Source += "/" + vm.SubPath
		}
		if vm.MountPropagation != nil {
			m.Propagation = string(*vm.MountPropagation)
		}
		p.Mounts = append(p.Mounts, m)
	}
	sort.Slice(p.Mounts, func(i, j int) bool { return p.Mounts[i].Destination < p.Mounts[j].Destination })
	for _, c := range run.Ports {
		p.PortBindings = append(p.PortBindings, fmt.Sprintf("%d/%s->%s:%d", c.ContainerPort, c.Protocol, c.HostIP, c.HostPort))
	}
	p.ProcMount = string(corev1.DefaultProcMount)
	if csc.ProcMount != nil && *csc.ProcMount == corev1.UnmaskedProcMount {
		p.MaskedPaths = []string{}
		p.ProcMount = string(corev1.UnmaskedProcMount)
	}
	p.Gaps = gaps(p)
	return p, nil
}

// Gaps the Kubernetes backend declares: protections the Pod does not carry,
// named by the audit rule that checks them on Docker.
const (
	gapPids    = "Kubernetes has no per-Pod PIDs limit: the node's kubelet podPidsLimit (or none) applies, which is node configuration the executor cannot read through the API; the Pod's CPU and memory limits still bound a fork bomb's cost"
	gapUlimits = "Kubernetes has no per-Pod ulimits: the container runtime's defaults (containerd's, from its systemd unit) apply; the run's ephemeral-storage limit bounds core dumps on disk"
	gapSeccomp = "the Pod runs under the runtime's default seccomp profile (RuntimeDefault), not taskrun's, which is not installed on the nodes: install it in the kubelet's seccomp dir and pass --seccomp-localhost to enforce it"
)

// gaps declares what p leaves unenforced.
func gaps(p sandbox.Posture) []sandbox.Gap {
	var out []sandbox.Gap
	if p.PidsLimit == nil {
		out = append(out, sandbox.Gap{Rule: "5.29", Reason: gapPids})
	}
	out = append(out, sandbox.Gap{Rule: "5.19", Reason: gapUlimits})
	for _, o := range p.SecurityOpt {
		if o == "seccomp=runtime/default" {
			out = append(out, sandbox.Gap{Rule: "TR:seccomp-profile", Reason: gapSeccomp})
		}
	}
	return out
}

// NetworkPolicyFacts is what the audit reads of a run's NetworkPolicy.
func NetworkPolicyFacts(np *networkingv1.NetworkPolicy) *sandbox.PostureNetworkPolicy {
	if np == nil {
		return nil
	}
	f := &sandbox.PostureNetworkPolicy{
		Name:                np.Name,
		PodSelector:         maps.Clone(np.Spec.PodSelector.MatchLabels),
		SelectorExpressions: len(np.Spec.PodSelector.MatchExpressions),
		IngressRules:        len(np.Spec.Ingress),
		EgressRules:         len(np.Spec.Egress),
	}
	for _, t := range np.Spec.PolicyTypes {
		f.PolicyTypes = append(f.PolicyTypes, string(t))
	}
	return f
}

// podPosture reads a Pod's posture with its NetworkPolicy (the one named
// after the Pod; none is a fact the audit refuses).
func podPosture(ctx context.Context, client *client, pod *corev1.Pod) (sandbox.Posture, error) {
	p, err := PostureFromPod(pod)
	if err != nil {
		return p, err
	}
	np, err := client.networkPolicies(pod.Namespace).Get(ctx, pod.Name)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return p, fmt.Errorf("get network policy %s: %w", pod.Name, err)
	default:
		p.NetworkPolicy = NetworkPolicyFacts(np)
	}
	ns, err := client.namespaces().Get(ctx, pod.Namespace)
	switch {
	case apierrors.IsForbidden(err):
		// A namespaced role may not read namespaces: the audit says so.
		p.Gaps = append(p.Gaps, sandbox.Gap{Rule: "PSS:namespace-restricted",
			Reason: fmt.Sprintf("the executor may not read namespace %s, so its Pod Security level is unknown: %v", pod.Namespace, err)})
	case err != nil:
		return p, fmt.Errorf("get namespace %s: %w", pod.Namespace, err)
	default:
		level := ns.Labels[LabelPodSecurityEnforce]
		p.PodSecurity = &level
	}
	return p, nil
}

// LabelPodSecurityEnforce is the namespace label naming the Pod Security
// level that admission enforces there.
const LabelPodSecurityEnforce = "pod-security.kubernetes.io/enforce"

// restartPolicy names a Pod's restart policy as the audit rules do:
// Never is Docker's "no".
func restartPolicy(p corev1.RestartPolicy) string {
	if p == corev1.RestartPolicyNever {
		return "no"
	}
	return string(p)
}

// Postures reads the posture of the named Pods, or of every managed Pod in
// the namespace when names is empty (for `taskrun audit`).
func (b *Backend) Postures(ctx context.Context, names ...string) ([]sandbox.Posture, error) {
	var pods []corev1.Pod
	if len(names) == 0 {
		list, err := b.client.pods(b.namespace).List(ctx, sandbox.LabelManaged+"=true")
		if err != nil {
			return nil, fmt.Errorf("list pods in %s: %w", b.namespace, err)
		}
		pods = list.Items
	}
	for _, n := range names {
		pod, err := b.client.pods(b.namespace).Get(ctx, n)
		if err != nil {
			return nil, fmt.Errorf("get pod %s: %w", n, err)
		}
		pods = append(pods, *pod)
	}
	out := make([]sandbox.Posture, 0, len(pods))
	for i := range pods {
		p, err := podPosture(ctx, b.client, &pods[i])
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// user is the effective uid:gid, the container's over the Pod's.
func user(psc *corev1.PodSecurityContext, csc *corev1.SecurityContext) string {
	uid, gid := psc.RunAsUser, psc.RunAsGroup
	if csc.RunAsUser != nil {
		uid = csc.RunAsUser
	}
	if csc.RunAsGroup != nil {
		gid = csc.RunAsGroup
	}
	if uid == nil {
		return ""
	}
	if gid == nil {
		return strconv.FormatInt(*uid, 10)
	}
	return strconv.FormatInt(*uid, 10) + ":" + strconv.FormatInt(*gid, 10)
}

// seccomp names the effective seccomp profile: "runtime/default",
// "localhost/<path>" or "unconfined".
func seccomp(psc *corev1.PodSecurityContext, csc *corev1.SecurityContext) string {
	sp := psc.SeccompProfile
	if csc.SeccompProfile != nil {
		sp = csc.SeccompProfile
	}
	if sp == nil {
		return ""
	}
	switch sp.Type {
	case corev1.SeccompProfileTypeRuntimeDefault:
		return "runtime/default"
	case corev1.SeccompProfileTypeLocalhost:
		if sp.LocalhostProfile != nil {
			return "localhost/" + *sp.LocalhostProfile
		}
		return "localhost/"
	default:
		return "unconfined"
	}
}
