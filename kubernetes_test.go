package taskrun_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/images"
	"github.com/taskrun/taskrun/internal/kubetest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/kubernetes"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// A run on the test cluster, end to end: the demo workspace goes into a
// restricted Pod, the reference agent reads AGENTS.md and talks to the
// scripted model through the gateway (served in the Pod by the model
// tunnel), and the result, artifact, change set, traces and isolation
// record come back to the store while the control plane hears every
// status. The audit judges the Pod as Kubernetes enforces it: nothing
// fails, and what a Pod cannot enforce is named as a gap.
func TestRunTaskOnKubernetes(t *testing.T) {
	c := kubetest.Require(t)
	c.RequireImage(t, images.PodHelperRef)
	c.RequireImage(t, kubetest.AgentImage)
	ns := c.Namespace(t)
	backend, err := kubernetes.New(t.Context(), c.Config, ns,
		kubernetes.WithInstance("kubetest-run"), kubernetes.WithStopGrace(time.Second))
	require.NoError(t, err)

	h := newHarness(t)
	ws := t.TempDir()
	require.NoError(t, os.CopyFS(ws, os.DirFS("examples/demo/workspace")))
	prompt, err := os.ReadFile("examples/demo/prompt.txt")
	require.NoError(t, err)

	rec := &controlplanetest.Recorder{}
	// A Pod cannot read its image's command: the reference agent's, named.
	in := h.Input("kube1", taskrun.DefaultImage, "/usr/local/bin/taskrun-agent")
	in.Sandbox = backend
	in.Updater, in.StreamSender = rec, rec
	in.Task.Prompt = string(prompt)
	in.Task.WorkspaceDir = ws
	in.HelpersDir = testbin.Dir(t)
	in.Model = config.ModelEntry{Provider: config.ProviderScripted, Name: gateway.DemoScriptName}
	in.Timeout = 2 * time.Minute

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err, "reason: %s, output: %s", out.Reason, out.Result.OutputStr)
	assert.Equal(t, model.StatusSucceeded, out.Status)
	final := last(t, rec)
	assert.Equal(t, model.StatusSucceeded, final.Status, "the control plane heard the end")
	require.NotNil(t, final.PromptTokens)
	assert.Positive(t, *final.PromptTokens, "the gateway metered the model's tokens")

	// Outputs: result, artifact, change set, traces.
	assert.NotEmpty(t, h.runFile(t, "kube1", "output/result.md"))
	report, err := h.Artifact(t.Context(), "kube1", "report.md")
	require.NoError(t, err)
	assert.NotEmpty(t, report)
	var changes changeset.Set
	require.NoError(t, json.Unmarshal([]byte(h.runFile(t, "kube1", taskrun.ChangesListName)), &changes))
	var paths []string
	for _, ch := range changes.Changes {
		paths = append(paths, ch.Path)
	}
	assert.Contains(t, paths, "greet.go", "the agent's edit came back")
	assert.Contains(t, paths, "CHANGELOG.md")
	gw, err := h.GlobalFile(t.Context(), filepath.Join("traces", h.SessionID, "gw_kube1.jsonl"))
	require.NoError(t, err)
	assert.Contains(t, string(gw), "this file: run context", "the agent sent the run's AGENTS.md to the model")
	rt, err := h.GlobalFile(t.Context(), filepath.Join("traces", h.SessionID, "rt_kube1.jsonl"))
	require.NoError(t, err)
	assert.NotEmpty(t, rt)

	// The isolation record: a Pod, judged as one.
	var record audit.Record
	require.NoError(t, json.Unmarshal([]byte(h.runFile(t, "kube1", taskrun.AuditRecordName)), &record))
	assert.Equal(t, sandbox.BackendKubernetes, record.Backend)
	assert.True(t, strings.HasPrefix(record.ContainerID, "containerd://"), record.ContainerID)
	for _, f := range record.Findings {
		assert.NotEqual(t, audit.Fail, f.Status, "rule %s: %s", f.ID, f.Reason)
	}
	var gaps []string
	for _, g := range record.Gaps {
		gaps = append(gaps, g.ID)
	}
	assert.ElementsMatch(t, []string{"5.29", "5.19", "TR:seccomp-profile"}, gaps, "the record names what the Pod does not enforce")
	require.NotNil(t, record.Probe, "the self-check reported from inside the Pod")
	assert.Empty(t, record.ProbeContradictions)
	assert.Equal(t, 2, record.Probe.Seccomp, "seccomp filter mode inside the Pod")
	assert.Equal(t, 1, record.Probe.NoNewPrivs)
	assert.Zero(t, record.Probe.CapEff)
	assert.Empty(t, record.Probe.ServiceAccountTokens)
	assert.Empty(t, record.Probe.Egress, "the self-check dials nothing out of a Pod")
	assert.False(t, record.Recheck().Failed())

	left, err := backend.ListManaged(t.Context(), map[string]string{sandbox.LabelInstance: "kubetest-run"})
	require.NoError(t, err)
	assert.Empty(t, left, "the run's Pod and NetworkPolicy are gone")
}

// An evicted run, end to end: the command prints on both streams, then
// writes past the run's disk cap, so the kubelet evicts its Pod. The run
// ends FAILED with a reason naming the eviction, and its output and stderr
// logs in the store hold everything the command wrote before it.
func TestEvictedRunOnKubernetesKeepsItsLogs(t *testing.T) {
	c := kubetest.Require(t)
	c.RequireImage(t, images.PodHelperRef)
	c.RequireImage(t, kubetest.TestboxImage)
	ns := c.Namespace(t)
	backend, err := kubernetes.New(t.Context(), c.Config, ns,
		kubernetes.WithInstance("kubetest-evicted"), kubernetes.WithStopGrace(time.Second))
	require.NoError(t, err)

	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "evicted1", "sh", "-c",
		`i=0; while [ $i -lt 300 ]; do i=$((i+1)); echo line-$i; done; echo err-line >&2; `+
			`head -c 100000000 /dev/urandom >"$HOME/big.bin"; sleep 90`)
	in.Sandbox = backend
	in.HelpersDir = testbin.Dir(t)
	in.DiskLimitBytes = 64 << 20
	in.Timeout = 3 * time.Minute

	out, err := taskrun.Execute(context.Background(), in)
	require.Error(t, err)
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.ErrorIs(t, err, kubernetes.ErrEvicted)
	assert.Contains(t, out.Reason, "evicted", "the reason names the eviction")
	assert.Equal(t, model.StatusFailed, last(t, rec).Status, "the control plane heard the end")

	var want strings.Builder
	for i := 1; i <= 300; i++ {
		fmt.Fprintf(&want, "line-%d\n", i)
	}
	assert.Equal(t, want.String(), h.runFile(t, "evicted1", taskrun.OutputLogName), "the output before the eviction is stored whole")
	assert.Contains(t, h.runFile(t, "evicted1", taskrun.StderrLogName), "err-line\n")

	left, err := backend.ListManaged(t.Context(), map[string]string{sandbox.LabelInstance: "kubetest-evicted"})
	require.NoError(t, err)
	assert.Empty(t, left, "the evicted run's Pod and NetworkPolicy are gone")
}
