package kubernetes

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/taskrun/taskrun/internal/kubetest"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/probe"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxtest"
)

// reachProbeRun runs the self-check in a Pod of b with the expectation the
// executor builds from b's capabilities (the node's kubelet and b's reach
// probes), before shell, and returns the run's exit code, stdout and the
// probe's report.
func reachProbeRun(t *testing.T, b *Backend, run, shell string) (int, string, string, probe.Report) {
	t.Helper()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "taskrun-probe"), "github.com/taskrun/taskrun/cmd/taskrun-probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	b2, err := build.CombinedOutput()
	require.NoError(t, err, "%s", b2)
	require.NoError(t, os.Chmod(dir, 0o755))
	var exp probe.Expectation
	exp.SkipEgressProbes = true
	for _, r := range b.Capabilities().Unreachable {
		exp.Unreachable = append(exp.Unreachable, probe.ReachTarget{Name: r.Name, Host: r.Host, HostEnv: r.HostEnv, Port: r.Port})
	}
	js, err := json.Marshal(exp)
	require.NoError(t, err)
	spec := sandbox.Spec{Image: sandboxtest.DefaultImage,
		Cmd:     []string{"sh", "-c", shell + "exec /helpers/taskrun-probe --nonce n --expect '" + string(js) + "' -- echo ran"},
		Run:     model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: run},
		Mounts:  []sandbox.Mount{{Source: dir, Target: "/helpers", ReadOnly: true}},
		Timeout: 2 * time.Minute, StopGrace: time.Second}
	var out, errOut lockedbuf.Buffer
	h, err := b.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{Stdout: &out, Stderr: &errOut})
	require.NoError(t, err)
	defer h.Close(t.Context())
	res := h.Wait(t.Context())
	require.NoError(t, res.Err, "stderr: %s", errOut.String())
	var rep probe.Report
	for line := range strings.SplitSeq(errOut.String(), "\n") {
		if r, err := probe.ParseLine([]byte(line), "n"); err == nil {
			rep = r
		}
	}
	require.NotEmpty(t, rep.Nonce, "the probe wrote its report: %s", errOut.String())
	return res.ExitCode, out.String(), errOut.String(), rep
}

// TestARunPodReachesNotItsNodesKubelet runs the self-check in a run Pod:
// the kubelet answers on the node's address from this machine, but not from
// the Pod (the test cluster confines its pods as their deny-all
// NetworkPolicy asks, scripts/kube-up.sh), so the probe's connect fails
// and the command runs.
func TestARunPodReachesNotItsNodesKubelet(t *testing.T) {
	e := requireCluster(t)
	node, err := e.cluster.Client.CoreV1().Nodes().Get(t.Context(), kubetest.NodeName, metav1.GetOptions{})
	require.NoError(t, err)
	kubeletPort := int(node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	b := newTestBackend(t, e, WithKubeletPort(kubeletPort))
	exit, out, stderr, rep := reachProbeRun(t, b, "reach-node", "")
	require.Len(t, rep.Reach, 1, "%+v", rep.Reach)
	kubelet := rep.Reach[0]
	t.Logf("from the Pod: %+v", kubelet)
	host, port, err := net.SplitHostPort(kubelet.Target)
	require.NoError(t, err, "the Pod knew its node's address")
	assert.Equal(t, strconv.Itoa(kubeletPort), port, "the node's kubelet port")
	c, err := net.DialTimeout("tcp", kubelet.Target, 5*time.Second)
	require.NoError(t, err, "the kubelet listens at %s (node %s): a Pod that cannot connect is confined, not facing a closed port", kubelet.Target, host)
	c.Close()
	assert.False(t, kubelet.Reachable, "the run Pod connected to its node's kubelet")
	assert.Equal(t, 0, exit, "stderr: %s", stderr)
	assert.Equal(t, "ran\n", out)
}

// TestSelfCheckRefusesARunThatReachesAnAddress gives the backend a reach
// probe at a listener the Pod can reach (one it starts on its own loopback,
// standing for a peer or node service a cluster without enforcement lets
// through): the self-check connects, refuses to start the command, and
// says what it reached.
func TestSelfCheckRefusesARunThatReachesAnAddress(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e, WithReachProbe("peer pod", "127.0.0.1", 9999))
	listen := "httpd -f -p 127.0.0.1:9999 -h / & i=0; while ! nc -z 127.0.0.1 9999 && [ $i -lt 50 ]; do i=$((i+1)); sleep 0.1; done; "
	exit, out, stderr, rep := reachProbeRun(t, b, "reach-peer", listen)
	require.Len(t, rep.Reach, 2, "%+v", rep.Reach)
	assert.True(t, rep.Reach[1].Reachable, "%+v", rep.Reach[1])
	assert.Equal(t, probe.ExitContradiction, exit, "stderr: %s", stderr)
	assert.Empty(t, out, "the command never ran")
	assert.Contains(t, stderr, "connected to peer pod at 127.0.0.1:9999, expected no route from the sandbox")
}
