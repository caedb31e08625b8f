package audit

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
)

// podCompliant is a run Pod's posture as the Kubernetes backend reports
// it: RuntimeDefault seccomp, no pids limit and no ulimits, each declared.
func podCompliant() Posture {
	name := "taskrun-run-1-abcd"
	restricted := "restricted"
	return Posture{
		PodSecurity:    &restricted,
		Backend:        sandbox.BackendKubernetes,
		ID:             "containerd://c0ffee",
		Name:           name,
		Labels:         map[string]string{sandbox.LabelManaged: "true", sandbox.LabelRun: "run-1", sandbox.LabelPod: name},
		User:           "10001:10001",
		WorkingDir:     "/taskrun/home",
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges", "seccomp=runtime/default"},
		ReadonlyRootfs: true,
		Memory:         1 << 30,
		MemorySwap:     1 << 30,
		NanoCPUs:       1e9,
		NetworkMode:    "pod",
		PidMode:        "private",
		IpcMode:        "private",
		Mounts: []Mount{
			{Type: "emptyDir", Source: "taskrun-bin", Destination: "/.taskrun-pod/bin"},
			{Type: "emptyDir", Source: "taskrun-data/m1", Destination: "/.taskrun/bin/taskrun-probe"},
			{Type: "emptyDir", Source: "taskrun-data/m0", Destination: "/taskrun", RW: true},
		},
		Tmpfs:            map[string]string{"/tmp": "rw,size=67108864"},
		RestartPolicy:    "no",
		LogDriver:        "kubelet",
		ProcMount:        "Default",
		EphemeralStorage: 1 << 30,
		NetworkPolicy: &sandbox.PostureNetworkPolicy{
			Name: name, PodSelector: map[string]string{sandbox.LabelPod: name}, PolicyTypes: []string{"Ingress", "Egress"},
		},
		Gaps: []sandbox.Gap{
			{Rule: "5.29", Reason: "no per-Pod pids limit"},
			{Rule: "5.19", Reason: "no per-Pod ulimits"},
			{Rule: "TR:seccomp-profile", Reason: "runtime default profile"},
		},
	}
}

var podHost = HostFacts{Seccomp: true}

func TestEveryRuleSaysHowItAppliesToEachBackend(t *testing.T) {
	for kind, table := range backendChecks {
		for _, id := range RuleIDs() {
			_, ok := table[id]
			assert.True(t, ok, "rule %s has no entry for backend %s", id, kind)
		}
		assert.Len(t, table, len(RuleIDs()), "backend %s lists rules the table does not have", kind)
	}
}

func TestCompliantPodPassesWithItsGapsNamed(t *testing.T) {
	r := Check(podCompliant(), podHost, Options{})
	require.Len(t, r.Findings, len(RuleIDs()))
	assert.Empty(t, r.FailedIDs(), "%+v", r.Findings)
	var gaps []string
	for _, f := range GapsOf(r.Findings) {
		assert.Equal(t, NotApplicable, f.Status)
		assert.Contains(t, f.Reason, "declared gap of the kubernetes backend")
		gaps = append(gaps, f.ID)
	}
	assert.ElementsMatch(t, []string{"5.29", "5.19", "TR:seccomp-profile"}, gaps)
	assert.Contains(t, findingByID(t, r, "5.10").Reason, "network plugin")
}

// TestUnreadableNamespaceIsADeclaredGap: an executor that may not read its
// namespace declares the level unknown, and the audit says so instead of
// passing or failing it.
func TestUnreadableNamespaceIsADeclaredGap(t *testing.T) {
	p := podCompliant()
	p.PodSecurity = nil
	p.Gaps = append(p.Gaps, sandbox.Gap{Rule: "PSS:namespace-restricted", Reason: "may not read the namespace"})
	r := Check(p, podHost, Options{})
	assert.Empty(t, r.FailedIDs())
	f := findingByID(t, r, "PSS:namespace-restricted")
	assert.Equal(t, NotApplicable, f.Status)
	assert.True(t, f.Gap)
}

func TestPodWithoutADeclaredGapFails(t *testing.T) {
	for _, id := range []string{"5.29", "5.19", "TR:seccomp-profile"} {
		p := podCompliant()
		var kept []sandbox.Gap
		for _, g := range p.Gaps {
			if g.Rule != id {
				kept = append(kept, g)
			}
		}
		p.Gaps = kept
		assert.Equal(t, []string{id}, Check(p, podHost, Options{}).FailedIDs(), "an undeclared gap is never silently passed")
	}
}

func TestEachPodBreakFailsExactlyItsRule(t *testing.T) {
	cases := map[string]struct {
		rule    string
		breakIt func(p *Posture)
	}{
		"no network policy":          {"5.10", func(p *Posture) { p.NetworkPolicy = nil }},
		"host network":               {"5.10", func(p *Posture) { p.NetworkMode = "host" }},
		"policy selects more":        {"5.10", func(p *Posture) { p.NetworkPolicy.PodSelector = map[string]string{sandbox.LabelManaged: "true"} }},
		"policy with an expression":  {"5.10", func(p *Posture) { p.NetworkPolicy.SelectorExpressions = 1 }},
		"policy allows egress":       {"5.10", func(p *Posture) { p.NetworkPolicy.EgressRules = 1 }},
		"policy ingress only":        {"5.10", func(p *Posture) { p.NetworkPolicy.PolicyTypes = []string{"Ingress"} }},
		"pod label not its name":     {"5.10", func(p *Posture) { p.Labels[sandbox.LabelPod] = "other" }},
		"unmasked proc":              {"TR:proc-masking", func(p *Posture) { p.ProcMount = "Unmasked" }},
		"no ephemeral storage limit": {"TR:log-capped", func(p *Posture) { p.EphemeralStorage = 0 }},
		"uncapped memory emptyDir":   {"TR:tmpfs", func(p *Posture) { p.Tmpfs["/tmp"] = "rw" }},
		"persistent volume": {"TR:only-run-mount", func(p *Posture) {
			p.Mounts = append(p.Mounts, Mount{Type: "volume", Source: "cache", Destination: "/cache"})
		}},
		"writable helper":       {"TR:only-run-mount", func(p *Posture) { p.Mounts[1].RW = true }},
		"egress policy":         {"TR:egress", func(p *Posture) { p.Labels[sandbox.LabelEgress] = "/taskrun/.gateway/egress.sock" }},
		"service account token": {"5.32", func(p *Posture) { p.ServiceAccountToken = true }},
		"capability added":      {"5.4", func(p *Posture) { p.CapAdd = []string{"NET_RAW"} }},
		"root":                  {"PSS:runAsNonRoot", func(p *Posture) { p.User = "0:0" }},
		"namespace unlabelled":  {"PSS:namespace-restricted", func(p *Posture) { p.PodSecurity = new(string) }},
		"namespace baseline": {"PSS:namespace-restricted", func(p *Posture) {
			baseline := "baseline"
			p.PodSecurity = &baseline
		}},
		"namespace level unknown": {"PSS:namespace-restricted", func(p *Posture) { p.PodSecurity = nil }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := podCompliant()
			tc.breakIt(&p)
			assert.Equal(t, []string{tc.rule}, Check(p, podHost, Options{}).FailedIDs())
		})
	}
}

func TestPodWithoutSeccompFailsBothSeccompRules(t *testing.T) {
	p := podCompliant()
	p.SecurityOpt = []string{"no-new-privileges"}
	assert.Equal(t, []string{"5.22", "TR:seccomp-profile"}, Check(p, podHost, Options{}).FailedIDs(), "Kubernetes runs a Pod without seccompProfile unconfined")
}

func TestPodLocalhostSeccompProfilePasses(t *testing.T) {
	p := podCompliant()
	p.SecurityOpt = []string{"no-new-privileges", "seccomp=localhost/taskrun/taskrun-v1.json"}
	p.Gaps = p.Gaps[:2]
	r := Check(p, podHost, Options{})
	assert.Empty(t, r.FailedIDs())
	assert.Equal(t, Pass, findingByID(t, r, "TR:seccomp-profile").Status)
}

// A Docker posture is judged on Docker's rules whatever it declares: gaps
// and Pod evidence do not excuse a missing protection.
func TestDockerPostureMissingAProtectionStillFails(t *testing.T) {
	p := compliant()
	p.PidsLimit = nil
	p.Ulimits = nil
	p.NetworkMode = "pod"
	p.NetworkPolicy = podCompliant().NetworkPolicy
	p.ProcMount = "Default"
	p.MaskedPaths = nil
	p.EphemeralStorage = 1 << 30
	p.LogDriver = "kubelet"
	p.Gaps = podCompliant().Gaps
	r := Check(p, fullHost, Options{})
	assert.ElementsMatch(t, []string{"5.29", "5.10", "TR:proc-masking", "TR:log-capped", "5.19"}, r.FailedIDs())
	assert.Empty(t, GapsOf(r.Findings), "Docker declares no gaps")

	p.Backend = sandbox.BackendDocker
	assert.Equal(t, r.FailedIDs(), Check(p, fullHost, Options{}).FailedIDs(), "an explicit docker backend is judged the same")
}

func TestUnknownBackendFailsEveryRule(t *testing.T) {
	p := podCompliant()
	p.Backend = "nomad"
	assert.Equal(t, RuleIDs(), Check(p, podHost, Options{}).FailedIDs())
}

func TestRecordNamesBackendAndGaps(t *testing.T) {
	rec := NewRecord("run-1", podCompliant(), podHost, Options{}, nil, nil, time.Unix(0, 0))
	raw, err := json.Marshal(rec)
	require.NoError(t, err)
	back, err := ParseRecord(raw)
	require.NoError(t, err)
	assert.Equal(t, sandbox.BackendKubernetes, back.Backend)
	require.Len(t, back.Gaps, 3)
	assert.True(t, back.Gaps[0].Gap)
	assert.Empty(t, back.Recheck().FailedIDs(), "a stored Pod record re-checks the same")

	docker := NewRecord("run-2", compliant(), fullHost, Options{}, nil, nil, time.Unix(0, 0))
	assert.Equal(t, sandbox.BackendDocker, docker.Backend)
	assert.Empty(t, docker.Gaps)
}
