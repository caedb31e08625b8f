package main

import (
	"context"
	"encoding/json"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/taskrun/taskrun/images"
	"github.com/taskrun/taskrun/internal/kubetest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// `taskrun run --backend kubernetes` runs the demo on the test cluster: the
// reference agent in a Pod, the scripted model through the gateway, the
// self-check and the Pod's audit passing.
func TestRunDemoOnKubernetes(t *testing.T) {
	c := kubetest.Require(t)
	c.RequireImage(t, images.PodHelperRef)
	c.RequireImage(t, kubetest.AgentImage)
	ns := c.Namespace(t)
	ws := t.TempDir()
	require.NoError(t, os.CopyFS(ws, os.DirFS("../../examples/demo/workspace")))
	prompt, err := os.ReadFile("../../examples/demo/prompt.txt")
	require.NoError(t, err)

	stdout, stderr, code := cli(t, "--backend", "kubernetes", "--kubeconfig", c.KubeconfigPath, "--namespace", ns,
		"--helpers-dir", testbin.Dir(t), "--workspace", ws, "--prompt", string(prompt), "--model", "scripted", "--json")
	require.Equal(t, 0, code, stderr)
	var res struct {
		Status model.RunStatus `json:"status"`
		Error  string          `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	assert.Equal(t, model.StatusSucceeded, res.Status, res.Error)
	assert.Contains(t, stderr, "final answer written", "the reference agent finished")
}

// `taskrun worker --backend kubernetes` leases a run and executes it as a
// Pod on the test cluster: output streamed, SUCCEEDED reported with the
// lease's fence, and no Pod left once the worker drained.
func TestWorkerOnKubernetes(t *testing.T) {
	c := kubetest.Require(t)
	c.RequireImage(t, images.PodHelperRef)
	c.RequireImage(t, kubetest.TestboxImage)
	ns := c.Namespace(t)
	env := newCrashEnv(t)
	cp := controlplanetest.New(t, workerToken)
	fleet := newWorkerFleet(t, env, cp.URL())
	w := fleet.startOn(cp.URL(), "", 1, "--image", kubetest.TestboxImage,
		"--backend", "kubernetes", "--kubeconfig", c.KubeconfigPath, "--namespace", ns)

	id := env.user + "-pod"
	cp.Enqueue(workerclient.Assignment{
		Task: model.Task{ID: "tpod", UserID: env.user, ConversationID: "c1"}, Run: model.TaskRun{ID: id, TaskID: "tpod"},
		SessionID: "s1", Image: kubetest.TestboxImage, Command: []string{"sh", "-c", "echo pod $TASKRUN_RUN_ID; ls /var/run/secrets 2>&1 | head -1"},
	})
	require.Eventually(t, func() bool { return cp.Lease(id).Status.Terminal() }, 3*time.Minute, 50*time.Millisecond)
	info := cp.Lease(id)
	require.Equal(t, model.StatusSucceeded, info.Status, info.Reason)
	data, ended, _ := cp.Stream(id)
	assert.True(t, ended)
	assert.Contains(t, string(data), "pod "+id+"\n")
	assert.NotContains(t, string(data), "kubernetes.io", "no service account token is mounted")
	for _, r := range cp.Requests(id) {
		assert.Positive(t, r.Fence, "%s %s carries the lease's fence", r.Method, r.Endpoint)
	}

	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-w.exited:
	case <-time.After(2 * time.Minute):
		t.Fatal("the worker did not exit")
	}
	assert.NoError(t, w.err, "a drained worker exits 0")
	pods, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, pods.Items, "no Pod is left")
}
