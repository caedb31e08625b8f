package audit

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/taskrun/taskrun/sandbox"
)

// checkFunc evaluates one rule.
type checkFunc func(c checkCtx) (Status, string)

// statusGap is what a backend-specific check returns when the backend
// does not enforce (or cannot show) the protection: Check turns it into
// NOT_APPLICABLE when the backend declared the gap, FAIL otherwise.
const statusGap Status = "gap"

// gapOnly is the check of a rule a backend cannot enforce at all.
func gapOnly(checkCtx) (Status, string) { return statusGap, "" }

// sameAsDocker marks a rule whose Docker check reads facts every backend
// reports alike.
var sameAsDocker checkFunc

// backendChecks says, per backend kind other than Docker, how each rule is
// evaluated there: sameAsDocker (nil) reuses the Docker check, gapOnly
// means the backend must declare the gap, anything else reads the evidence
// that backend enforces the protection with. Every rule has an entry for
// every backend (a test checks it): a new rule must say how it applies.
var backendChecks = map[string]map[string]checkFunc{
	sandbox.BackendKubernetes: {
		"5.5":                       sameAsDocker,
		"5.4":                       sameAsDocker,
		"PSS:capabilities-drop-all": sameAsDocker,
		"5.26":                      sameAsDocker,
		"5.22":                      checkPodSeccomp,
		"TR:seccomp-profile":        checkPodSeccompProfile,
		"5.2":                       sameAsDocker,
		"5.13":                      sameAsDocker,
		"5.11":                      sameAsDocker,
		"TR:no-swap":                sameAsDocker,
		"5.12":                      sameAsDocker,
		"5.29":                      checkPodPids,
		"5.10":                      checkPodNetwork,
		"TR:egress":                 checkPodEgress,
		"5.16":                      sameAsDocker,
		"5.17":                      sameAsDocker,
		"5.21":                      sameAsDocker,
		"5.31":                      sameAsDocker,
		"5.32":                      checkPodSockets,
		"5.6":                       sameAsDocker,
		"5.20":                      sameAsDocker,
		"TR:only-run-mount":         checkPodMounts,
		"TR:tmpfs":                  checkPodTmpfs,
		"5.18":                      sameAsDocker,
		"5.8":                       sameAsDocker,
		"5.15":                      sameAsDocker,
		"5.25":                      sameAsDocker,
		"PSS:runAsNonRoot":          sameAsDocker,
		"TR:proc-masking":           checkPodProcMount,
		"TR:log-capped":             checkPodLog,
		"TR:gvisor":                 sameAsDocker,
		"TR:workdir-not-proc":       sameAsDocker,
		"5.19":                      gapOnly,
		"PSS:namespace-restricted":  checkPodNamespace,
	},
}

// Backends lists the backend kinds the rules know.
func Backends() []string {
	return append([]string{sandbox.BackendDocker}, slices.Sorted(maps.Keys(backendChecks))...)
}

// checkFor returns how rl is evaluated on backend kind, and false for a
// backend the audit does not know.
func (rl rule) checkFor(kind string) (checkFunc, bool) {
	if kind == sandbox.BackendDocker {
		return rl.check, true
	}
	table, ok := backendChecks[kind]
	if !ok {
		return nil, false
	}
	f, ok := table[rl.id]
	if !ok {
		return gapOnly, true
	}
	if f == nil {
		return rl.check, true
	}
	return f, true
}

// declaredGap is the posture's declared gap for rule id.
func declaredGap(p Posture, id string) (sandbox.Gap, bool) {
	for _, g := range p.Gaps {
		if g.Rule == id {
			return g, true
		}
	}
	return sandbox.Gap{}, false
}

// evaluate runs rule rl on c for the posture's backend and resolves gaps.
func evaluate(rl rule, c checkCtx) (Status, string, bool) {
	kind := c.p.Kind()
	f, ok := rl.checkFor(kind)
	if !ok {
		st, why := fail("backend %q is not one the audit knows (known: %v)", kind, Backends())
		return st, why, false
	}
	st, why := f(c)
	if st != statusGap {
		return st, why, false
	}
	g, ok := declaredGap(c.p, rl.id)
	if !ok {
		st, why := fail("the %s backend does not enforce this and declared no gap for it", kind)
		return st, why, false
	}
	reason := fmt.Sprintf("declared gap of the %s backend: %s", kind, g.Reason)
	if why != "" {
		reason = why + "; " + reason
	}
	return NotApplicable, reason, true
}

func checkPodSeccomp(c checkCtx) (Status, string) {
	v, ok := securityOpt(c.p.SecurityOpt, "seccomp")
	switch {
	case !ok:
		return fail("no seccompProfile set: Kubernetes runs the container unconfined; set RuntimeDefault or Localhost")
	case v == "runtime/default":
		return pass("seccompProfile RuntimeDefault (the container runtime's default filter)")
	case strings.HasPrefix(v, "localhost/") && len(v) > len("localhost/"):
		return pass("seccompProfile Localhost %s", strings.TrimPrefix(v, "localhost/"))
	}
	return fail("seccompProfile is %q; set RuntimeDefault or Localhost", v)
}

// checkPodSeccompProfile: taskrun's profile reaches a Pod only as a
// Localhost profile installed on the node; the executor names it but cannot
// read the node's file. With RuntimeDefault the runtime's own syscall list
// applies: a gap the backend declares.
func checkPodSeccompProfile(c checkCtx) (Status, string) {
	v, _ := securityOpt(c.p.SecurityOpt, "seccomp")
	if lp, ok := strings.CutPrefix(v, "localhost/"); ok && lp != "" {
		return pass("Localhost profile %s, taskrun's profile as installed on the node (the executor cannot read the node's file to compare it with %s)", lp, c.opts.SeccompProfile.SHA256)
	}
	if v == "runtime/default" {
		return statusGap, "seccompProfile RuntimeDefault, not taskrun's profile"
	}
	return fail("seccompProfile is %q; want taskrun's profile as a Localhost profile (or RuntimeDefault with the gap declared)", v)
}

func checkPodPids(c checkCtx) (Status, string) {
	if c.p.PidsLimit != nil && *c.p.PidsLimit > 0 {
		return pass("PidsLimit is %d", *c.p.PidsLimit)
	}
	return statusGap, "no per-Pod PIDs limit in the Pod spec"
}

// checkPodNetwork: a Pod always has a network namespace with an interface;
// what isolates it is the run's deny-all NetworkPolicy selecting exactly
// the Pod, and no host network.
func checkPodNetwork(c checkCtx) (Status, string) {
	if c.p.NetworkMode != "pod" {
		return fail("NetworkMode is %q; a run Pod must not use the host network", c.p.NetworkMode)
	}
	np := c.p.NetworkPolicy
	if np == nil {
		return fail("no NetworkPolicy selects the Pod: its network is open")
	}
	podLabel := c.p.Labels[sandbox.LabelPod]
	want := map[string]string{sandbox.LabelPod: c.p.Name}
	switch {
	case podLabel != c.p.Name:
		return fail("Pod label %s is %q, not the Pod's name %q", sandbox.LabelPod, podLabel, c.p.Name)
	case !maps.Equal(np.PodSelector, want) || np.SelectorExpressions > 0:
		return fail("NetworkPolicy %s selects %v (+%d expressions), not exactly the Pod (%v)", np.Name, np.PodSelector, np.SelectorExpressions, want)
	case !slices.Contains(np.PolicyTypes, "Ingress") || !slices.Contains(np.PolicyTypes, "Egress"):
		return fail("NetworkPolicy %s has policyTypes %v; it must deny both Ingress and Egress", np.Name, np.PolicyTypes)
	case np.IngressRules > 0 || np.EgressRules > 0:
		return fail("NetworkPolicy %s allows traffic (%d ingress, %d egress rules); it must allow none", np.Name, np.IngressRules, np.EgressRules)
	}
	return pass("deny-all NetworkPolicy %s (Ingress and Egress, no rule) selects exactly Pod %s; no host network. Enforcement depends on the cluster's network plugin: one without NetworkPolicy support ignores it, which the self-check's connects to the node's kubelet and the configured peers find (TR:probe)", np.Name, c.p.Name)
}

func checkPodEgress(c checkCtx) (Status, string) {
	if _, ok := c.p.Labels[sandbox.LabelEgress]; ok {
		return fail("the run has an egress policy, but a Pod has no egress proxy: its deny-all NetworkPolicy leaves no route out")
	}
	return pass("no egress policy: the deny-all NetworkPolicy leaves no route out (5.10), as far as the self-check's reachability probes find (TR:probe)")
}

// checkPodMounts: a Pod's mounts hold only what the executor copied in:
// emptyDir volumes of the Pod, writable only at the run dir.
func checkPodMounts(c checkCtx) (Status, string) {
	var bad []string
	for _, m := range c.p.Mounts {
		dst := path.Clean("/" + m.Destination)
		switch {
		case m.Type == "bind":
			continue // a hostPath: judged by 5.32 and 5.6 when sensitive, here otherwise
		case m.Type != "emptyDir":
			bad = append(bad, fmt.Sprintf("%s volume %q at %s (only the Pod's emptyDir volumes may be mounted)", m.Type, m.Source, dst))
		case m.RW && dst != RunDirTarget:
			bad = append(bad, fmt.Sprintf("%s is writable; only %s may be", dst, RunDirTarget))
		case under(dst, HelperTarget) && len(c.opts.Mounts.HelperFiles) > 0:
			if _, ok := c.opts.Mounts.HelperFiles[dst]; !ok {
				bad = append(bad, fmt.Sprintf("helper %s is not one of the run's helper files", dst))
			}
		}
	}
	for _, m := range c.p.Mounts {
		if m.Type == "bind" && !isSocketMount(m) && !isSensitiveMount(m) {
			bad = append(bad, fmt.Sprintf("hostPath %s at %s", m.Source, m.Destination))
		}
	}
	if len(bad) > 0 {
		return fail("mounts outside the policy: %s", strings.Join(bad, "; "))
	}
	return pass("%d mounts, all emptyDir volumes of the Pod filled by the executor; only %s writable", len(c.p.Mounts), RunDirTarget)
}

// checkPodTmpfs: Kubernetes mounts a memory emptyDir without nosuid and
// nodev; in a container with no capability (no CAP_MKNOD) and
// no_new_privs, device nodes cannot be made and set-uid bits raise nothing.
// The size cap is required.
func checkPodTmpfs(c checkCtx) (Status, string) {
	var bad []string
	dsts := slices.Sorted(maps.Keys(c.p.Tmpfs))
	for _, dst := range dsts {
		if !strings.Contains(c.p.Tmpfs[dst], "size=") || strings.Contains(c.p.Tmpfs[dst], "size=0") {
			bad = append(bad, fmt.Sprintf("%s %q has no sizeLimit", dst, c.p.Tmpfs[dst]))
		}
	}
	if len(bad) > 0 {
		return fail("memory emptyDir not size-capped: %s", strings.Join(bad, "; "))
	}
	if len(dsts) == 0 {
		return pass("no memory-backed emptyDir")
	}
	if st, why := checkNoNewPrivs(c); st != Pass {
		return fail("memory emptyDir without nosuid, and %s", why)
	}
	if st, why := checkCapDrop(c); st != Pass {
		return fail("memory emptyDir without nodev, and %s", why)
	}
	return pass("%d memory emptyDir volumes, each size-capped; Kubernetes sets no nosuid/nodev on them, made inert by no_new_privs and dropping ALL capabilities (no CAP_MKNOD)", len(dsts))
}

// checkPodNamespace: Pod Security admission refuses, in a namespace that
// enforces "restricted", any Pod that loosens the run's confinement.
func checkPodNamespace(c checkCtx) (Status, string) {
	switch {
	case c.p.PodSecurity == nil:
		return statusGap, ""
	case *c.p.PodSecurity == "":
		return fail("the namespace enforces no Pod Security level: label it pod-security.kubernetes.io/enforce=restricted")
	case *c.p.PodSecurity != "restricted":
		return fail("the namespace enforces Pod Security %q: label it pod-security.kubernetes.io/enforce=restricted", *c.p.PodSecurity)
	}
	return pass("the namespace enforces Pod Security \"restricted\"")
}

func checkPodProcMount(c checkCtx) (Status, string) {
	if c.p.ProcMount != "Default" {
		return fail("procMount is %q; it must be Default (masked /proc paths, read-only /proc/sys)", c.p.ProcMount)
	}
	return pass("procMount Default: the runtime masks /proc paths and mounts /proc/sys read-only")
}

// checkPodLog: the kubelet counts a container's log against its
// ephemeral-storage limit and evicts the Pod past it.
func checkPodLog(c checkCtx) (Status, string) {
	if c.p.EphemeralStorage <= 0 {
		return fail("no ephemeral-storage limit: the container's log is capped only by the node's log rotation")
	}
	return pass("the container's log counts against its ephemeral-storage limit of %d bytes (the kubelet evicts the Pod past it; the node's containerLogMaxSize rotates it)", c.p.EphemeralStorage)
}

// checkPodSockets: besides a runtime socket, a service account token is
// the cluster's API handed to the agent.
func checkPodSockets(c checkCtx) (Status, string) {
	if c.p.ServiceAccountToken {
		return fail("a service account token is mounted (automountServiceAccountToken not false, or a projected token): the agent could call the cluster's API")
	}
	st, why := checkSockets(c)
	if st == Pass {
		why += "; no service account token mounted"
	}
	return st, why
}

// GapsOf lists the findings that are declared gaps of the backend.
func GapsOf(findings []Finding) []Finding {
	var out []Finding
	for _, f := range findings {
		if f.Gap {
			out = append(out, f)
		}
	}
	return out
}
