package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/helpers/podhelper"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxtest"
)

// clusterSpec is a run of the test image: runID (of user u, conversation
// c, task t) runs cmd within timeout, stopped with a second's grace.
func clusterSpec(runID string, timeout time.Duration, cmd ...string) sandbox.Spec {
	return sandbox.Spec{Image: sandboxtest.DefaultImage, Cmd: cmd,
		Run: model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: runID}, Timeout: timeout, StopGrace: time.Second}
}

// halfCPU is the default policy with half a CPU, so that the test
// cluster's node fits several runs at once.
func halfCPU() sandbox.Policy {
	pol := sandbox.DefaultPolicy()
	pol.NanoCPUs = 500_000_000
	return pol
}

// startRun starts spec on b under pol, its stdout and stderr into the
// buffers it returns; the run is closed at cleanup.
func startRun(t *testing.T, b *Backend, spec sandbox.Spec, pol sandbox.Policy) (sandbox.Handle, *lockedbuf.Buffer, *lockedbuf.Buffer) {
	t.Helper()
	var out, errOut lockedbuf.Buffer
	h, err := b.Start(t.Context(), spec, pol, sandbox.Streams{Stdout: &out, Stderr: &errOut})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h, &out, &errOut
}

// awaitOutput waits, a minute at most, for marker in out.
func awaitOutput(t *testing.T, out *lockedbuf.Buffer, marker string) {
	t.Helper()
	select {
	case <-out.Seen(marker):
	case <-time.After(time.Minute):
		t.Fatalf("the run never printed %q", marker)
	}
}

// mountableRunDir is a run directory a Pod's user may write to.
func mountableRunDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o777))
	return dir
}

// requireNoneLeft checks b manages no Pod or NetworkPolicy of its
// instance any more.
func requireNoneLeft(t *testing.T, b *Backend, e *testEnv) {
	t.Helper()
	left, err := b.ListManaged(t.Context(), map[string]string{sandbox.LabelInstance: e.instance})
	require.NoError(t, err)
	assert.Empty(t, left, "the Pod and its NetworkPolicy are deleted")
}

// numberedLines is format (with one %d) for 1 to n, a line each.
func numberedLines(format string, n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, format+"\n", i)
	}
	return b.String()
}

// TestRestrictedNamespaceAdmitsOnlyTaskrunsPods submits (server-side dry
// run: admission runs, nothing is stored) the Pod the converter makes, then
// the same Pod with one field loosened: the API server admits the first
// and refuses each loosened one as Forbidden by Pod Security.
func TestRestrictedNamespaceAdmitsOnlyTaskrunsPods(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e)
	spec := sandbox.Spec{Image: sandboxtest.DefaultImage, Cmd: []string{"true"}, Run: model.RunRef{RunID: "admission"},
		Timeout: time.Minute, StopGrace: time.Second,
		Mounts: []sandbox.Mount{{Source: "/runs/r", Target: "/taskrun"}}}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	create := func(pod *corev1.Pod) error {
		_, err := b.clientset().CoreV1().Pods(e.namespace).Create(t.Context(), pod, dryRun)
		return err
	}
	cv, err := convert(spec, sandbox.DefaultPolicy(), b.podConfig(spec, "", time.Now()))
	require.NoError(t, err)
	require.NoError(t, create(cv.Pod), "the restricted namespace must admit taskrun's Pod")

	yes := true
	root := int64(0)
	loosen := map[string]func(*corev1.Pod){
		"allowPrivilegeEscalation": func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes },
		// Privileged with allowPrivilegeEscalation false is not even valid.
		"privileged": func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Privileged = &yes
			p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
		},
		"capability NET_RAW": func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_RAW"}
		},
		"runAsUser 0": func(p *corev1.Pod) { p.Spec.SecurityContext.RunAsUser = &root },
		"hostNetwork": func(p *corev1.Pod) { p.Spec.HostNetwork = true },
		"seccomp unconfined": func(p *corev1.Pod) {
			p.Spec.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		},
		"hostPath": func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		},
	}
	for name, edit := range loosen {
		t.Run(name, func(t *testing.T) {
			pod := cv.Pod.DeepCopy()
			edit(pod)
			err := create(pod)
			require.Error(t, err)
			var status *apierrors.StatusError
			require.True(t, errors.As(err, &status), "want a typed API status, got %T: %v", err, err)
			assert.Equal(t, metav1.StatusReasonForbidden, status.ErrStatus.Reason, status.ErrStatus.Message)
			assert.True(t, apierrors.IsForbidden(err))
		})
	}
}

// TestPostureOfALivePod reads a running Pod's posture and evaluates the
// audit rules on it: the confinement taskrun sets passes, and the facts
// the Pod cannot have are reported as failing rather than passing.
func TestPostureOfALivePod(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e)
	h, out, _ := startRun(t, b, clusterSpec("posture", 2*time.Minute, "sh", "-c", "echo up; sleep 1000"), halfCPU())
	awaitOutput(t, out, "up")
	p, err := h.Posture(t.Context())
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(p.ID, "containerd://"), "the posture names the live container: %q", p.ID)
	assert.Equal(t, "10001:10001", p.User)
	assert.Equal(t, "posture", p.Labels[sandbox.LabelRun])
	assert.Equal(t, e.instance, p.Labels[sandbox.LabelInstance])

	rep := audit.Check(p, sandbox.HostFacts{Seccomp: true}, audit.Options{})
	failed := rep.FailedIDs()
	for _, id := range []string{"5.5", "5.4", "PSS:capabilities-drop-all", "5.26", "5.22", "5.13", "5.11", "5.12", "PSS:runAsNonRoot", "5.16", "5.17"} {
		assert.False(t, slices.Contains(failed, id), "rule %s fails on taskrun's Pod", id)
	}
	assert.Empty(t, failed, "taskrun's Pod passes the audit as Kubernetes enforces it: %v", rep.Findings)
	byID := map[string]audit.Finding{}
	for _, f := range rep.Findings {
		byID[f.ID] = f
	}
	assert.Equal(t, audit.NotApplicable, byID["5.29"].Status, "a Pod has no pids limit: the rule must say so")
	assert.True(t, byID["5.29"].Gap, "the missing pids limit is a declared gap")
	assert.True(t, byID["5.19"].Gap, "the missing ulimits are a declared gap")
	assert.Equal(t, audit.Pass, byID["5.10"].Status, "the deny-all NetworkPolicy is the network evidence")
	assert.Contains(t, byID["5.10"].Reason, "network plugin")
	assert.Equal(t, audit.Pass, byID["PSS:namespace-restricted"].Status, "the test namespace enforces restricted")

	// The run's NetworkPolicy selects exactly its Pod, and goes with it.
	np, err := b.clientset().NetworkingV1().NetworkPolicies(e.namespace).Get(t.Context(), h.ID(), metav1.GetOptions{})
	require.NoError(t, err)
	pod, err := b.clientset().CoreV1().Pods(e.namespace).Get(t.Context(), h.ID(), metav1.GetOptions{})
	require.NoError(t, err)
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	require.NoError(t, err)
	assert.True(t, sel.Matches(labels.Set(pod.Labels)))
	assert.Empty(t, np.Spec.Egress)

	// Without its NetworkPolicy the Pod's network is open: 5.10 fails.
	require.NoError(t, b.clientset().NetworkingV1().NetworkPolicies(e.namespace).Delete(t.Context(), h.ID(), metav1.DeleteOptions{}))
	p, err = h.Posture(t.Context())
	require.NoError(t, err)
	assert.Nil(t, p.NetworkPolicy)
	assert.Equal(t, []string{"5.10"}, audit.Check(p, sandbox.HostFacts{Seccomp: true}, audit.Options{}).FailedIDs())

	// A namespace that stops enforcing "restricted" fails its rule.
	ns, err := b.clientset().CoreV1().Namespaces().Get(t.Context(), e.namespace, metav1.GetOptions{})
	require.NoError(t, err)
	delete(ns.Labels, LabelPodSecurityEnforce)
	_, err = b.clientset().CoreV1().Namespaces().Update(t.Context(), ns, metav1.UpdateOptions{})
	require.NoError(t, err)
	p, err = h.Posture(t.Context())
	require.NoError(t, err)
	require.NotNil(t, p.PodSecurity)
	assert.Empty(t, *p.PodSecurity)
	assert.Equal(t, []string{"5.10", "PSS:namespace-restricted"}, audit.Check(p, sandbox.HostFacts{Seccomp: true}, audit.Options{}).FailedIDs())
	require.NoError(t, h.Close(t.Context()))
	left, err := b.ListManaged(t.Context(), map[string]string{sandbox.LabelRun: "posture", sandbox.LabelInstance: e.instance})
	require.NoError(t, err)
	assert.Empty(t, left)
}

// TestCommandCannotReachTheGate runs a command that tries to forge the
// executor's acknowledgement on the gate's stdin and to write to the
// container's stdout and stderr behind the gate's count, through
// /proc/1/fd: the gate (PID 1) is not dumpable, so its descriptors belong
// to root and every attempt is refused; the output arrives whole. The
// command also writes a termination message saying output was lost: the
// gate replaces it when it exits, so the run reports no error.
func TestCommandCannotReachTheGate(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e)
	script := `echo "owner=$(stat -c %u /proc/1/fd)"
for fd in 0 1 2; do
  if (echo 'ack 999999999 999999999' >/proc/1/fd/$fd) 2>/dev/null; then echo "fd$fd=open"; else echo "fd$fd=refused"; fi
done
printf '` + podhelper.UnacknowledgedPrefix + `forged' >` + podhelper.TerminationLog + ` && echo log=written
head -c 200000 /dev/zero | tr '\0' z
echo end`
	h, out, errOut := startRun(t, b, clusterSpec("forge", 2*time.Minute, "sh", "-c", script), halfCPU())
	res := h.Wait(t.Context())
	require.NoError(t, res.Err)
	require.Equal(t, 0, res.ExitCode, "stderr: %s", errOut.String())
	want := "owner=0\nfd0=refused\nfd1=refused\nfd2=refused\nlog=written\n" + strings.Repeat("z", 200000) + "end\n"
	got := out.String()
	require.Equal(t, len(want), len(got), "stdout: %.200q", got)
	assert.True(t, want == got, "stdout differs: %.200q", got)
	assert.Empty(t, errOut.String())
	require.NoError(t, h.Close(t.Context()))
}

// stallWriter blocks its first write for stall, then accepts everything.
type stallWriter struct {
	stall time.Duration
	once  sync.Once
	buf   lockedbuf.Buffer
}

func (w *stallWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { time.Sleep(w.stall) })
	return w.buf.Write(p)
}

// TestStalledReaderIsReportedAsIncompleteOutput stalls the executor's
// stdout writer longer than the gate waits without progress: the run
// container exits without the acknowledgement, and the run reports its
// output as possibly incomplete, with the command's real exit status.
func TestStalledReaderIsReportedAsIncompleteOutput(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e, WithAckIdle(2*time.Second))
	out := &stallWriter{stall: 8 * time.Second}
	spec := clusterSpec("stall", 2*time.Minute, "sh", "-c", "echo out; exit 3")
	h, err := b.Start(t.Context(), spec, halfCPU(), sandbox.Streams{Stdout: out})
	require.NoError(t, err)
	defer h.Close(t.Context())
	res := h.Wait(t.Context())
	require.ErrorIs(t, res.Err, ErrOutputIncomplete)
	assert.Contains(t, res.Err.Error(), "no progress forwarding or acknowledging output for 2s")
	assert.Equal(t, 3, res.ExitCode, "the status is the command's")
	require.NoError(t, h.Close(t.Context()))
}

// TestCompressibleOutputComesBackFromAPod has a Pod write a 20 MB repetitive
// file (about 1000:1 under gzip) into its mount under a 64 MiB disk cap: the
// run succeeds, the data volume is the run's cap, and the file reaches the
// host whole.
func TestCompressibleOutputComesBackFromAPod(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e)
	runDir := mountableRunDir(t)
	spec := clusterSpec("compressible", 2*time.Minute, "sh", "-c", "head -c 20000000 /dev/zero | tr '\\0' z >/taskrun/big.txt && echo written")
	spec.Mounts, spec.DiskBytes = []sandbox.Mount{{Source: runDir, Target: "/taskrun"}}, 64<<20
	h, out, errOut := startRun(t, b, spec, sandbox.DefaultPolicy())

	pod, err := b.clientset().CoreV1().Pods(e.namespace).Get(t.Context(), h.(*handle).name, metav1.GetOptions{})
	require.NoError(t, err)
	for _, v := range pod.Spec.Volumes {
		if v.Name == VolumeData {
			require.NotNil(t, v.EmptyDir.SizeLimit)
			assert.Equal(t, int64(64<<20), v.EmptyDir.SizeLimit.Value(), "the run's disk cap sizes the data volume")
		}
	}

	res := h.Wait(t.Context())
	require.NoError(t, res.Err, "stderr: %s", errOut.String())
	require.Equal(t, 0, res.ExitCode, "stderr: %s", errOut.String())
	assert.Equal(t, "written\n", out.String())
	info, err := os.Stat(filepath.Join(runDir, "big.txt"))
	require.NoError(t, err, "the file came back to the host")
	assert.Equal(t, int64(20000000), info.Size())
	require.NoError(t, h.Close(t.Context()))
}

// stopAPIServer freezes the test cluster's kube-apiserver (SIGSTOP) for d,
// then resumes it (SIGCONT), also when the test fails first. Its PID comes
// from kube-up's state directory, next to the kubeconfig; a cluster not
// started by kube-up skips the test.
func stopAPIServer(t *testing.T, e *testEnv, d time.Duration) (done <-chan struct{}) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(filepath.Dir(e.cluster.KubeconfigPath), "pids", "kube-apiserver.pid"))
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("the cluster was not started by scripts/kube-up.sh: no kube-apiserver PID to stop")
	}
	require.NoError(t, err)
	fields := strings.Fields(string(data))
	require.NotEmpty(t, fields)
	pid, err := strconv.Atoi(fields[0])
	require.NoError(t, err)
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	require.NoError(t, err)
	require.Equal(t, "kube-apiserver", filepath.Base(exe), "pid %d is kube-apiserver", pid)
	var once sync.Once
	resume := func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	ch := make(chan struct{})
	time.AfterFunc(d, func() { resume(); close(ch) })
	return ch
}

// TestRunSurvivesAFrozenAPIServer freezes kube-apiserver for 15s in the
// middle of a run whose command exits during the outage: the run's reads of
// its Pod ride the outage out, and the run ends with exit 0, no error and
// every line of its output, its Pod deleted.
func TestRunSurvivesAFrozenAPIServer(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e)
	spec := clusterSpec("outage", 3*time.Minute, "sh", "-c", "i=0; while [ $i -lt 12 ]; do i=$((i+1)); echo line $i; sleep 0.5; done")
	h, out, errOut := startRun(t, b, spec, sandbox.DefaultPolicy())
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "line 2\n") }, time.Minute, 20*time.Millisecond)

	const outage = 15 * time.Second
	start := time.Now()
	resumed := stopAPIServer(t, e, outage)
	res := h.Wait(t.Context())
	<-resumed
	t.Logf("run ended %s after the API server was frozen for %s", time.Since(start).Round(time.Millisecond), outage)

	require.NoError(t, res.Err, "stderr: %s", errOut.String())
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, numberedLines("line %d", 12), out.String(), "the whole output came back")
	require.NoError(t, h.Close(t.Context()))
	requireNoneLeft(t, b, e)
}

// TestReapRemovesOnlyPodsOfGoneExecutors leaves two running Pods behind as
// executors would: one of an executor whose process has exited and whose
// lock file is gone (only the Pod's process record proves it gone), one of
// an executor that holds its lock. A third executor's Reap, deciding with
// the instance locks as the executor's recovery does, removes the first
// and spares the second.
func TestReapRemovesOnlyPodsOfGoneExecutors(t *testing.T) {
	e := requireCluster(t)
	locks := t.TempDir()
	live, err := instance.Start(locks)
	require.NoError(t, err)
	defer live.Close()
	exited := exec.Command("true")
	require.NoError(t, exited.Run())
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	require.NoError(t, err)
	deadID := instance.NewID()
	deadProcess := fmt.Sprintf("%d/1/%s", exited.Process.Pid, strings.TrimSpace(string(boot)))

	start := func(b *Backend, run string) *handle {
		h, _, _ := startRun(t, b, clusterSpec(run, 5*time.Minute, "sleep", "300"), sandbox.DefaultPolicy())
		return h.(*handle)
	}
	dead := start(newTestBackend(t, e, WithInstance(deadID), WithInstanceProcess(deadProcess)), "dead")
	alive := start(newTestBackend(t, e, WithInstance(live.ID()), WithInstanceProcess(live.Info().Process())), "alive")

	reaper := newTestBackend(t, e)
	gone := func(id, process string) (bool, string) {
		g, why, err := instance.Gone(locks, instance.ParseProcess(id, process))
		require.NoError(t, err)
		return g, why
	}
	rep, err := reaper.Reap(t.Context(), ReapOptions{Grace: time.Millisecond, ExecutorGone: gone})
	require.NoError(t, err)
	require.Len(t, rep.Removed, 1, "%+v", rep)
	assert.Equal(t, dead.name, rep.Removed[0].Name)
	assert.Contains(t, rep.Removed[0].Reason, "executor "+deadID+" is gone")
	assert.Equal(t, 1, rep.Spared)

	left, err := reaper.ListManaged(t.Context(), nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"lease/" + alive.name, "networkpolicy/" + alive.name, alive.name}, left, "the live executor's Pod is spared, the gone one's deleted")
}

// flakyProxy forwards TCP connections to the API server at target until
// down, which closes its listener (new connections are refused) and every
// open connection (reset), as a restarting kube-apiserver does, for this
// test's client alone.
type flakyProxy struct {
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
}

func newFlakyProxy(t *testing.T, target string) *flakyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &flakyProxy{target: target, addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	go p.serve(ln)
	t.Cleanup(p.down)
	return p
}

func (p *flakyProxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

func (p *flakyProxy) pipe(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(u, c); u.Close() }()
	_, _ = io.Copy(c, u)
	c.Close()
}

// down refuses new connections and resets the open ones.
func (p *flakyProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// up accepts connections again on the same address.
func (p *flakyProxy) up(t *testing.T) {
	ln, err := net.Listen("tcp", p.addr)
	if !assert.NoError(t, err) {
		return
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go p.serve(ln)
}

// backendThroughProxy is a backend on the test namespace reaching the API
// server through a flakyProxy.
func backendThroughProxy(t *testing.T, e *testEnv, opts ...Option) (*Backend, *flakyProxy) {
	t.Helper()
	cfg := rest.CopyConfig(e.cluster.Config)
	u, err := url.Parse(cfg.Host)
	require.NoError(t, err)
	p := newFlakyProxy(t, u.Host)
	cfg.Host = "https://" + p.addr
	b, err := New(t.Context(), cfg, e.namespace, append([]Option{WithInstance(e.instance), WithStopGrace(time.Second)}, opts...)...)
	require.NoError(t, err)
	return b, p
}

// TestRunEndsAcrossAnAPIServerThatRefusesConnections cuts the backend off
// the API server (connections reset, new ones refused) for 5s just after
// the run's command exited: the run's reads of its Pod retry until the
// server is back, the run succeeds with its output, and its Pod is deleted.
func TestRunEndsAcrossAnAPIServerThatRefusesConnections(t *testing.T) {
	e := requireCluster(t)
	b, p := backendThroughProxy(t, e)
	h, out, errOut := startRun(t, b, clusterSpec("refused", 2*time.Minute, "sh", "-c", "echo one; echo two"), sandbox.DefaultPolicy())
	<-h.(*handle).pumpDone // the run container exited

	const outage = 5 * time.Second
	p.down()
	start := time.Now()
	time.AfterFunc(outage, func() { p.up(t) })
	res := h.Wait(t.Context())
	took := time.Since(start)
	t.Logf("the run ended %s after the API server became unreachable for %s", took.Round(time.Millisecond), outage)
	require.NoError(t, res.Err, "stderr: %s", errOut.String())
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, "one\ntwo\n", out.String())
	assert.GreaterOrEqual(t, took, outage, "the run waited for the server")
	require.NoError(t, h.Close(t.Context()))
	requireNoneLeft(t, b, e)
}

// TestRunFailsPastTheAPIServerOutageBound keeps the API server unreachable
// past the backend's bound: the run ends with ErrAPIServerUnreachable naming
// the server and the fix, and its Pod is deleted once the server is back.
func TestRunFailsPastTheAPIServerOutageBound(t *testing.T) {
	e := requireCluster(t)
	b, p := backendThroughProxy(t, e, WithAPIOutage(2*time.Second))
	h, _, _ := startRun(t, b, clusterSpec("unreachable", 2*time.Minute, "true"), sandbox.DefaultPolicy())
	<-h.(*handle).pumpDone

	p.down()
	res := h.Wait(t.Context())
	require.ErrorIs(t, res.Err, ErrAPIServerUnreachable)
	assert.Contains(t, res.Err.Error(), p.addr, "the reason names the API server")
	assert.Contains(t, res.Err.Error(), "check that kube-apiserver is running")

	time.AfterFunc(time.Second, func() { p.up(t) })
	require.NoError(t, h.Close(t.Context()), "the Pod is deleted once the server is back")
	requireNoneLeft(t, b, e)
}

// TestRunStartsAcrossAnAPIServerThatRefusesConnections starts a run while
// the API server refuses connections for 3s: Start's creates and reads wait
// for it, and the run succeeds with its output.
func TestRunStartsAcrossAnAPIServerThatRefusesConnections(t *testing.T) {
	e := requireCluster(t)
	b, p := backendThroughProxy(t, e)
	const outage = 3 * time.Second
	p.down()
	start := time.Now()
	time.AfterFunc(outage, func() { p.up(t) })
	h, out, errOut := startRun(t, b, clusterSpec("refused-start", 2*time.Minute, "echo", "started"), sandbox.DefaultPolicy())
	assert.GreaterOrEqual(t, time.Since(start), outage, "Start waited for the server")
	res := h.Wait(t.Context())
	require.NoError(t, res.Err, "stderr: %s", errOut.String())
	assert.Equal(t, "started\n", out.String())
	require.NoError(t, h.Close(t.Context()))
}

// TestDollarsReachTheShellAsWritten runs a command with "$$" and "$(HOME)"
// on a real Pod: the kubelet expands neither, so the shell prints its own
// PID and an empty command substitution, as on the Docker engine.
func TestDollarsReachTheShellAsWritten(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e)
	spec := clusterSpec("dollars", 2*time.Minute, "sh", "-c", "echo pid=$$; echo sub=$(HOME); echo env=$DOLLAR")
	spec.Env = []string{"DOLLAR=a$(HOME)b$$c"}
	h, out, errOut := startRun(t, b, spec, halfCPU())
	res := h.Wait(t.Context())
	require.NoError(t, res.Err)
	require.Equal(t, 0, res.ExitCode, "stderr: %s", errOut.String())
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 3, "stdout: %q", out.String())
	assert.Regexp(t, `^pid=[0-9]+$`, lines[0], "$$ is the shell's PID")
	assert.Equal(t, "sub=", lines[1], "$(HOME) is a command substitution, not the kubelet's")
	assert.Equal(t, "env=a$(HOME)b$$c", lines[2], "env values reach the shell unexpanded")
	require.NoError(t, h.Close(t.Context()))
}

// TestRunPastItsDiskCapFailsWithTheReason writes past the run's 64 MiB disk
// cap on a real Pod: the kubelet evicts the Pod, and the run fails naming the
// eviction and the cap rather than a failed copy-out.
func TestRunPastItsDiskCapFailsWithTheReason(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e)
	spec := clusterSpec("overdisk", 3*time.Minute, "sh", "-c", "echo kept >/taskrun/kept.txt && head -c 100000000 /dev/urandom >/taskrun/big.bin; echo wrote=$?; sleep 90")
	spec.Mounts, spec.DiskBytes = []sandbox.Mount{{Source: mountableRunDir(t), Target: "/taskrun"}}, 64<<20
	h, out, errOut := startRun(t, b, spec, halfCPU())
	start := time.Now()
	res := h.Wait(t.Context())
	t.Logf("after %s: err=%v exit=%d stdout=%q stderr=%q", time.Since(start), res.Err, res.ExitCode, out.String(), errOut.String())
	require.ErrorIs(t, res.Err, ErrEvicted, "the run fails past its disk cap")
	assert.Contains(t, res.Err.Error(), "exceeds", "the kubelet's reason is named")
	assert.Contains(t, res.Err.Error(), "disk cap is 67108864 bytes")
	assert.NotContains(t, res.Err.Error(), "gzip", "no copy-out from a Pod that is gone")
	require.NoError(t, h.Close(t.Context()))
}

// TestDeletingTheRunPodReapsItsNetworkPolicy deletes a live run's Pod as an
// administrator (or a reaper that knows nothing of NetworkPolicies) would,
// without the executor: the cluster's garbage collector deletes the Pod's
// NetworkPolicy, which the Pod owns.
func TestDeletingTheRunPodReapsItsNetworkPolicy(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e)
	h, out, _ := startRun(t, b, clusterSpec("owned", 2*time.Minute, "sh", "-c", "echo up; sleep 1000"), sandbox.DefaultPolicy())
	awaitOutput(t, out, "up")
	cs := b.clientset()
	pod, err := cs.CoreV1().Pods(e.namespace).Get(t.Context(), h.ID(), metav1.GetOptions{})
	require.NoError(t, err)
	np, err := cs.NetworkingV1().NetworkPolicies(e.namespace).Get(t.Context(), h.ID(), metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, np.OwnerReferences, 1)
	assert.Equal(t, pod.UID, np.OwnerReferences[0].UID, "the Pod owns its NetworkPolicy")

	zero := int64(0)
	require.NoError(t, cs.CoreV1().Pods(e.namespace).Delete(t.Context(), h.ID(), metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	deleted := time.Now()
	assert.Eventually(t, func() bool {
		_, err := cs.NetworkingV1().NetworkPolicies(e.namespace).Get(t.Context(), h.ID(), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 90*time.Second, 200*time.Millisecond, "the garbage collector deletes the NetworkPolicy of a deleted run Pod")
	t.Logf("the NetworkPolicy was gone %s after the Pod's deletion", time.Since(deleted).Round(100*time.Millisecond))
}

// TestReapRemovesAPodStoppedAtItsDeadline shortens a live run's active
// deadline (as if its executor had stopped renewing its interest long ago):
// once the cluster stops the Pod at that deadline, another executor's
// reaper removes it, though its executor is not proven gone, and the
// cluster deletes its NetworkPolicy with it.
func TestReapRemovesAPodStoppedAtItsDeadline(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e)
	h, _, _ := startRun(t, b, clusterSpec("deadline", 5*time.Minute, "sleep", "300"), sandbox.DefaultPolicy())
	cs := b.clientset()
	patch := []byte(`{"spec":{"activeDeadlineSeconds":1}}`)
	_, err := cs.CoreV1().Pods(e.namespace).Patch(t.Context(), h.ID(), types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		pod, err := cs.CoreV1().Pods(e.namespace).Get(t.Context(), h.ID(), metav1.GetOptions{})
		return err == nil && pod.Status.Phase == corev1.PodFailed && pod.Status.Reason == reasonDeadlineExceeded
	}, 90*time.Second, time.Second, "the kubelet stops the Pod at its deadline")

	reaper := newTestBackend(t, e, WithInstance("another-executor"))
	alive := func(string, string) (bool, string) { return false, "" }
	rep, err := reaper.Reap(t.Context(), ReapOptions{Grace: time.Millisecond, ExecutorGone: alive,
		Labels: map[string]string{sandbox.LabelRun: "deadline"}})
	require.NoError(t, err)
	require.Len(t, rep.Removed, 1, "%+v", rep)
	assert.Equal(t, h.ID(), rep.Removed[0].Name)
	assert.Contains(t, rep.Removed[0].Reason, "active deadline")
	assert.Eventually(t, func() bool {
		left, err := reaper.ListManaged(t.Context(), map[string]string{sandbox.LabelRun: "deadline"})
		return err == nil && len(left) == 0
	}, 90*time.Second, time.Second, "no Pod or NetworkPolicy of the run is left")
}

// TestEvictedRunKeepsItsOutput writes output on both streams, then writes
// past the run's disk cap, so the kubelet evicts the Pod: the run fails
// with ErrEvicted and the kubelet's reason, and every byte the command
// wrote before the eviction has reached the run's streams.
func TestEvictedRunKeepsItsOutput(t *testing.T) {
	e := requireCluster(t)
	b := newTestBackend(t, e)
	spec := clusterSpec("evicted-output", 3*time.Minute, "sh", "-c", "i=0; while [ $i -lt 500 ]; do i=$((i+1)); echo line-$i; done; echo err-line >&2; "+
		"head -c 100000000 /dev/urandom >/taskrun/big.bin; sleep 90")
	spec.Mounts, spec.DiskBytes = []sandbox.Mount{{Source: mountableRunDir(t), Target: "/taskrun"}}, 64<<20
	h, out, errOut := startRun(t, b, spec, halfCPU())
	res := h.Wait(t.Context())
	require.ErrorIs(t, res.Err, ErrEvicted, "exit %d, %v", res.ExitCode, res.Err)
	assert.Equal(t, numberedLines("line-%d", 500), out.String(), "the output written before the eviction is kept whole")
	assert.Equal(t, "err-line\n", errOut.String())
	require.NoError(t, h.Close(t.Context()))
}
