package kubernetes

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/taskrun/taskrun/internal/kubetest"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxtest"
)

// Environment of TestExecutorChild, the executor TestKilledExecutorsRunIsReaped
// starts as a process of its own and kills.
const (
	childNamespaceEnv = "TASKRUN_TEST_CHILD_NAMESPACE"
	childInstanceEnv  = "TASKRUN_TEST_CHILD_INSTANCE"
	childPodPrefix    = "child-pod "
)

// Timing of the killed executor's run.
const (
	childRunTimeout = 2 * time.Minute
	childLease      = 10 * time.Second
)

// TestExecutorChild is not a test on its own: run by
// TestKilledExecutorsRunIsReaped with its environment set, it starts a run
// that sleeps, prints its Pod's name and waits to be killed.
func TestExecutorChild(t *testing.T) {
	ns := os.Getenv(childNamespaceEnv)
	if ns == "" {
		t.Skip("the executor that TestKilledExecutorsRunIsReaped starts and kills")
	}
	c := kubetest.Require(t)
	b, err := New(context.Background(), c.Config, ns, WithInstance(os.Getenv(childInstanceEnv)),
		WithStopGrace(time.Second), WithLeaseDuration(childLease))
	require.NoError(t, err)
	spec := sandbox.Spec{Image: sandboxtest.DefaultImage, Cmd: []string{"sleep", "1000"},
		Run:     model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "killed"},
		Timeout: childRunTimeout, StopGrace: time.Second}
	h, err := b.Start(context.Background(), spec, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.NoError(t, err)
	fmt.Printf("%s%s\n", childPodPrefix, h.ID())
	select {} // until SIGKILL
}

// TestKilledExecutorsRunIsReaped starts a run in an executor process of
// its own, kills it with SIGKILL and freezes the API server for 5s (when
// kube-up started it): the run's Lease is no longer renewed, and another
// executor's reaper, which cannot prove the killed executor gone (it is not
// on its host), removes the run's Lease, Pod and NetworkPolicy once the
// Lease expired, well within the run's timeout plus one minute. While the
// executor lived, the same reaper spared the run.
func TestKilledExecutorsRunIsReaped(t *testing.T) {
	e := requireCluster(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestExecutorChild$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), childNamespaceEnv+"="+e.namespace, childInstanceEnv+"="+e.instance)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	podc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if name, ok := strings.CutPrefix(sc.Text(), childPodPrefix); ok {
				podc <- name
			}
		}
		close(podc)
	}()
	var pod string
	select {
	case name, ok := <-podc:
		require.True(t, ok, "the executor process ended before its run started")
		pod = name
	case <-time.After(3 * time.Minute):
		t.Fatal("the executor process did not start its run")
	}
	sel := map[string]string{sandbox.LabelRun: "killed"}
	reaper := newTestBackend(t, e, WithInstance("another-executor"))
	notProven := func(string, string) (bool, string) { return false, "" }
	reap := func() ReapReport {
		rep, err := reaper.Reap(t.Context(), ReapOptions{Grace: time.Millisecond, ExecutorGone: notProven, Labels: sel})
		require.NoError(t, err)
		return rep
	}

	cs := reaper.clientset()
	p, err := cs.CoreV1().Pods(e.namespace).Get(t.Context(), pod, metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, p.OwnerReferences, 1)
	assert.Equal(t, "Lease", p.OwnerReferences[0].Kind, "the run's Lease owns its Pod")
	// Past one lease duration, renewed: the live executor's run is spared.
	time.Sleep(childLease + childLease/2)
	rep := reap()
	assert.Empty(t, rep.Removed, "the live executor's run is spared: it renews its lease")
	lease, err := cs.CoordinationV1().Leases(e.namespace).Get(t.Context(), pod, metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, lease.Spec.RenewTime.After(lease.Spec.AcquireTime.Time), "the executor renewed its lease")

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	killed := time.Now()
	if _, err := os.Stat(filepath.Join(filepath.Dir(e.cluster.KubeconfigPath), "pids", "kube-apiserver.pid")); err == nil {
		<-stopAPIServer(t, e, 5*time.Second)
	} else if !errors.Is(err, os.ErrNotExist) {
		require.NoError(t, err)
	}

	deadline := killed.Add(childRunTimeout + time.Minute)
	var removed []ReapedPod
	for {
		rep := reap()
		removed = append(removed, rep.Removed...)
		left, err := reaper.ListManaged(t.Context(), sel)
		require.NoError(t, err)
		if len(left) == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "left %v past the run's timeout plus one minute after the kill; reaped %+v", left, removed)
		time.Sleep(time.Second)
	}
	t.Logf("the killed executor's run was gone %s after the kill (lease %s)", time.Since(killed).Round(time.Second), childLease)
	require.Len(t, removed, 1, "%+v", removed)
	assert.Equal(t, pod, removed[0].Name)
	assert.Contains(t, removed[0].Reason, "lease expired")
}
