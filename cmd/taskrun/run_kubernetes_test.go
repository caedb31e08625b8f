package main

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/images"
	"github.com/taskrun/taskrun/internal/kubetest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
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
