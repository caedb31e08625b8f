package executor

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/probe"
	"github.com/taskrun/taskrun/sandbox"
)

// Docker's self-check expectation is unchanged by the backend kinds.
func TestDockerExpectationKeepsDockerConfinement(t *testing.T) {
	pol := sandbox.DefaultPolicy()
	e := expectation(pol, sandbox.CapabilitiesOf(nil))
	assert.True(t, e.NetworkNone)
	require.NotNil(t, e.PidsMax)
	assert.Equal(t, pol.PidsLimit, *e.PidsMax)
	assert.False(t, e.SkipEgressProbes)
}

// A Pod's expectation holds what a Pod guarantees, and still refuses a
// sandbox that contradicts it.
func TestPodExpectationChecksWhatAPodGuarantees(t *testing.T) {
	pol := sandbox.DefaultPolicy()
	// What sandbox/kubernetes's Backend states (its own tests check it).
	e := expectation(pol, sandbox.Capabilities{Kind: sandbox.BackendKubernetes, DescribesHost: true, OwnNetwork: true, NoServiceAccount: true})
	assert.False(t, e.NetworkNone, "a Pod has an interface; its NetworkPolicy confines it")
	assert.True(t, e.SkipEgressProbes, "the self-check does not dial out of a Pod")
	assert.Nil(t, e.PidsMax, "no per-Pod pids limit exists (a declared gap)")
	require.NotNil(t, e.UID)
	for name, ok := range map[string]bool{"non-root": e.NonRoot, "CapEff": e.CapEffZero, "CapBnd": e.CapBndZero,
		"no_new_privs": e.NoNewPrivs, "seccomp": e.SeccompFilter, "read-only root": e.RootfsReadOnly,
		"/proc/sys": e.ProcSysReadOnly, "docker socket": e.NoDockerSocket, "token": e.NoServiceAccountToken} {
		assert.True(t, ok, "a Pod's expectation checks %s", name)
	}

	good := probe.Report{UID: *e.UID, GID: *e.UID, NoNewPrivs: 1, Seccomp: 2, RootfsReadOnly: true, RootfsWriteError: "read-only file system",
		ProcSysReadOnly: true, MemoryLimit: pol.MemoryBytes, PidsMax: probe.Unlimited, Interfaces: []string{"eth0"}, SocketSearchComplete: true}
	assert.Empty(t, e.Contradictions(good), "a Pod as the backend makes it passes")
	for name, breakIt := range map[string]func(r *probe.Report){
		"a capability":       func(r *probe.Report) { r.CapEff = 1 << 21 },
		"no no_new_privs":    func(r *probe.Report) { r.NoNewPrivs = 0 },
		"no seccomp filter":  func(r *probe.Report) { r.Seccomp = 0 },
		"another uid":        func(r *probe.Report) { r.UID = 1000 },
		"a writable root":    func(r *probe.Report) { r.RootfsReadOnly, r.RootfsWriteError = false, "" },
		"a token":            func(r *probe.Report) { r.ServiceAccountTokens = []string{probe.ServiceAccountTokenPaths[0]} },
		"no memory limit":    func(r *probe.Report) { r.MemoryLimit = probe.Unlimited },
		"a Docker socket":    func(r *probe.Report) { r.DockerSockets = []string{"/run/docker.sock"} },
		"writable /proc/sys": func(r *probe.Report) { r.ProcSysReadOnly = false },
	} {
		r := good
		breakIt(&r)
		assert.NotEmpty(t, e.Contradictions(r), "a Pod with %s is refused", name)
	}
}

// The addresses a backend says its sandbox must not reach are probed, and
// a connect to one refuses the run.
func TestPodExpectationProbesTheNodeAndPeers(t *testing.T) {
	caps := sandbox.Capabilities{Kind: sandbox.BackendKubernetes, OwnNetwork: true, Unreachable: []sandbox.ReachTarget{
		{Name: "node kubelet", HostEnv: "TASKRUN_NODE_IP", Port: 10250}, {Name: "peer", Host: "10.0.0.9", Port: 8080}}}
	e := expectation(sandbox.DefaultPolicy(), caps)
	assert.Equal(t, []probe.ReachTarget{{Name: "node kubelet", HostEnv: "TASKRUN_NODE_IP", Port: 10250}, {Name: "peer", Host: "10.0.0.9", Port: 8080}}, e.Unreachable)
	r := probe.Report{Reach: []probe.Egress{{Name: "node kubelet", Target: "192.0.2.2:10250", Reachable: true}, {Name: "peer", Target: "10.0.0.9:8080", Error: "i/o timeout"}}}
	assert.Contains(t, e.Contradictions(r), "connected to node kubelet at 192.0.2.2:10250, expected no route from the sandbox")
}
