package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
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
	"github.com/taskrun/taskrun/runindex"
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

// `taskrun exec --namespace` reaches a run on the test cluster: the command
// runs in the run's Pod as the run's own user with no capability and
// no-new-privileges, its exit status is exec's, and it is recorded.
func TestExecReachesARunOnKubernetes(t *testing.T) {
	c := kubetest.Require(t)
	c.RequireImage(t, images.PodHelperRef)
	c.RequireImage(t, kubetest.TestboxImage)
	ns := c.Namespace(t)
	root, store, user := t.TempDir(), "file://"+filepath.Join(t.TempDir(), "store"), tenant(t)
	runID := "kexec-" + user
	done := make(chan int, 1)
	go func() {
		_, _, code := taskrunCmd("run", "--root", root, "--store", store, "--helpers-dir", "", "--gc=false",
			"--backend", "kubernetes", "--kubeconfig", c.KubeconfigPath, "--namespace", ns,
			"--user", user, "--run-id", runID, "--image", kubetest.TestboxImage,
			"--", "sh", "-c", "id -u > /tmp/agent-uid; while [ ! -e $HOME/stop ]; do sleep 0.2; done")
		done <- code
	}()
	require.Eventually(t, func() bool {
		out, _, code := taskrunCmd("runs", "--store", store, "--user", user, "--json")
		var recs []runindex.Record
		return code == exitOK && json.Unmarshal([]byte(out), &recs) == nil && len(recs) == 1 && recs[0].Status == model.StatusRunning
	}, 3*time.Minute, 100*time.Millisecond)
	kexec := func(cmd ...string) (string, string, int) {
		var out, errOut string
		var code int
		// The run is RUNNING in the index a moment before its Pod's run
		// container is: an exec that finds no live Pod yet is retried.
		require.Eventually(t, func() bool {
			out, errOut, code = taskrunCmd(append([]string{"exec", "--store", store, "--kubeconfig", c.KubeconfigPath, "--namespace", ns, runID, "--"}, cmd...)...)
			return !strings.Contains(errOut, "no running pod")
		}, time.Minute, 200*time.Millisecond)
		return out, errOut, code
	}

	out, stderr, code := kexec("sh", "-c", `echo "uid $(id -u) agent $(cat /tmp/agent-uid)"; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status`)
	require.Equal(t, exitOK, code, stderr)
	fields := strings.Fields(strings.SplitN(out, "\n", 2)[0])
	require.Len(t, fields, 4, out)
	assert.Equal(t, fields[1], fields[3], "the command runs as the run's uid")
	assert.NotEqual(t, "0", fields[1])
	assert.Regexp(t, `CapEff:\s+0000000000000000`, out)
	assert.Regexp(t, `NoNewPrivs:\s+1`, out)

	_, _, code = kexec("sh", "-c", "exit 3")
	assert.Equal(t, 3, code, "exec exits with the command's status")

	// The Pod names its executor for the reaper: instance ID, process
	// record and host.
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "dev.taskrun.managed=true"})
	require.NoError(t, err)
	require.Len(t, pods.Items, 1)
	host, err := os.Hostname()
	require.NoError(t, err)
	meta := pods.Items[0].ObjectMeta
	assert.NotEmpty(t, meta.Labels["dev.taskrun.instance"])
	assert.Regexp(t, `^[0-9]+/[0-9]+/[0-9a-f-]+$`, meta.Annotations["dev.taskrun.instance-process"])
	assert.Equal(t, host, meta.Annotations["dev.taskrun.instance-host"])

	_, stderr, code = kexec("touch", "/taskrun/home/stop")
	require.Equal(t, exitOK, code, stderr)
	require.Equal(t, exitOK, <-done)

	out, stderr, code = taskrunCmd("inspect", "--store", store, "--json", runID)
	require.Equal(t, exitOK, code, stderr)
	var rec runindex.Record
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	require.Len(t, rec.Execs, 3)
	assert.Equal(t, 3, rec.Execs[1].Exit)
}
