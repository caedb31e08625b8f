package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/taskrun/taskrun/images"
	"github.com/taskrun/taskrun/internal/kubetest"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
)

// TestKilledExecutorsPodIsRemovedByGC kills `taskrun run --backend
// kubernetes` with SIGKILL, then runs `taskrun gc --namespace`: the run is
// recovered as FAILED, indexed once, and its Pod and NetworkPolicy are gone.
func TestKilledExecutorsPodIsRemovedByGC(t *testing.T) {
	c := kubetest.Require(t)
	c.RequireImage(t, images.PodHelperRef)
	c.RequireImage(t, kubetest.TestboxImage)
	ns := c.Namespace(t)
	root, store, user := t.TempDir(), "file://"+filepath.Join(t.TempDir(), "store"), tenant(t)
	runID := "kkill-" + user
	run := exec.Command(taskrunBin(t), "run", "--root", root, "--store", store, "--helpers-dir", "", "--gc=false",
		"--backend", "kubernetes", "--kubeconfig", c.KubeconfigPath, "--namespace", ns,
		"--user", user, "--run-id", runID, "--image", kubetest.TestboxImage,
		"--", "sh", "-c", "while true; do sleep 1; done")
	var runErr lockedbuf.Buffer
	run.Stderr = &runErr
	require.NoError(t, run.Start())
	t.Cleanup(func() { _ = run.Process.Kill(); _ = run.Wait() })
	ctx := context.Background()
	require.Eventually(t, func() bool {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 1 && pods.Items[0].Status.Phase == "Running"
	}, 3*time.Minute, 200*time.Millisecond, "the run's Pod never ran: %s", &runErr)
	require.NoError(t, run.Process.Signal(syscall.SIGKILL))
	_ = run.Wait()

	gc := exec.Command(taskrunBin(t), "gc", "--root", root, "--grace", "1s", "--kubeconfig", c.KubeconfigPath, "--namespace", ns)
	out, err := gc.CombinedOutput()
	require.NoError(t, err, "gc: %s", out)
	assert.Contains(t, string(out), "recovered run "+runID)
	assert.Contains(t, string(out), "removed 1 pod(s)")

	require.Eventually(t, func() bool {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0
	}, time.Minute, 200*time.Millisecond, "the run's Pod is left")
	pols, err := c.Client.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, pols.Items, "the run's NetworkPolicy is left")

	idx, _, code := taskrunCmd("runs", "--store", store, "--user", user, "--json")
	require.Equal(t, exitOK, code)
	var recs []runindex.Record
	require.NoError(t, json.Unmarshal([]byte(idx), &recs))
	require.Len(t, recs, 1, "the run is indexed once")
	assert.Equal(t, model.StatusFailed, recs[0].Status)
}
