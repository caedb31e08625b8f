package kubernetes_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/kubernetes"
)

// A Pod's capabilities, which the orchestrator keys the self-check on:
// no shared run dir (no hold), its own network interface, no pids limit,
// no service account token; and they say what the backend implements.
// (The conformance case StatedCapabilities checks the same on a cluster.)
func TestCapabilitiesStateWhatAPodIs(t *testing.T) {
	var b sandbox.Backend = &kubernetes.Backend{}
	caps := sandbox.CapabilitiesOf(b)
	assert.Equal(t, sandbox.BackendKubernetes, caps.Kind)
	assert.False(t, caps.SharesRunDir, "a Pod gets a copy of the run dir")
	assert.True(t, caps.OwnNetwork, "a Pod has an interface; its NetworkPolicy confines it")
	assert.False(t, caps.LimitsPids, "no per-Pod pids limit exists")
	assert.True(t, caps.NoServiceAccount)
	assert.Equal(t, []sandbox.ReachTarget{{Name: "node kubelet", HostEnv: kubernetes.EnvNodeIP, Port: kubernetes.KubeletPort}}, caps.Unreachable,
		"the self-check connects to the node's kubelet rather than trusting the NetworkPolicy")
	_, creates := b.(sandbox.Creator)
	_, describes := b.(sandbox.EngineDescriber)
	_, resolves := b.(sandbox.ImageResolver)
	_, checks := b.(sandbox.ImageChecker)
	assert.Equal(t, creates, caps.CreatesAhead)
	assert.Equal(t, describes, caps.DescribesHost)
	assert.Equal(t, resolves, caps.ResolvesImages)
	assert.Equal(t, checks, caps.ChecksImages)
}
