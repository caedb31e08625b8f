package kubernetes

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"

	"github.com/taskrun/taskrun/helpers/podhelper"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
)

var created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func testSpec() sandbox.Spec {
	return sandbox.Spec{
		Name:       "taskrun-Run_42",
		Run:        model.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "Run_42"},
		Image:      "taskrun/testbox:local",
		Cmd:        []string{"sh", "-c", "echo hi"},
		Wrapper:    []string{"/.taskrun/bin/taskrun-probe", "--"},
		Env:        []string{"HOME=/taskrun/home", "A=b=c"},
		WorkingDir: "/taskrun/home",
		Mounts: []sandbox.Mount{
			{Source: "/runs/r1", Target: "/taskrun"},
			{Source: "/cache/taskrun", Target: "/.taskrun/bin/taskrun-probe", ReadOnly: true},
		},
		Labels:    map[string]string{"dev.taskrun.run-dir": "/runs/r1", "team": "x"},
		Timeout:   10 * time.Minute,
		StopGrace: 3 * time.Second,
	}
}

func testConfig() podConfig {
	return podConfig{
		Namespace:     "runs",
		Name:          "taskrun-run-42-abcd1234",
		HelperImage:   DefaultHelperImage,
		DiskBytes:     1 << 30,
		LogBytes:      64 << 20,
		CPURequest:    resource.MustParse("50m"),
		MemoryRequest: resource.MustParse("64Mi"),
		Instance:      "inst1",
		Created:       created,
		Slack:         5 * time.Minute,
	}
}

func mustConvert(t *testing.T, spec sandbox.Spec, pol sandbox.Policy, cfg podConfig) converted {
	t.Helper()
	cv, err := convert(spec, pol, cfg)
	require.NoError(t, err)
	return cv
}

func runContainer(t *testing.T, pod *corev1.Pod) corev1.Container {
	t.Helper()
	for _, c := range pod.Spec.Containers {
		if c.Name == ContainerRun {
			return c
		}
	}
	t.Fatal("no run container")
	return corev1.Container{}
}

func TestConvertPodSpec(t *testing.T) {
	cv := mustConvert(t, testSpec(), sandbox.DefaultPolicy(), testConfig())
	pod := cv.Pod
	ps := pod.Spec
	run := runContainer(t, pod)
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"name", pod.Name, "taskrun-run-42-abcd1234"},
		{"namespace", pod.Namespace, "runs"},
		{"restartPolicy", ps.RestartPolicy, corev1.RestartPolicyNever},
		{"automountServiceAccountToken", *ps.AutomountServiceAccountToken, false},
		{"enableServiceLinks", *ps.EnableServiceLinks, false},
		{"hostNetwork", ps.HostNetwork, false},
		{"hostPID", ps.HostPID, false},
		{"hostIPC", ps.HostIPC, false},
		{"shareProcessNamespace", *ps.ShareProcessNamespace, false},
		{"runAsNonRoot", *ps.SecurityContext.RunAsNonRoot, true},
		{"runAsUser", *ps.SecurityContext.RunAsUser, int64(10001)},
		{"runAsGroup", *ps.SecurityContext.RunAsGroup, int64(10001)},
		{"seccomp", ps.SecurityContext.SeccompProfile.Type, corev1.SeccompProfileTypeRuntimeDefault},
		{"runtimeClassName", ps.RuntimeClassName, (*string)(nil)},
		{"terminationGracePeriodSeconds", *ps.TerminationGracePeriodSeconds, int64(3)},
		// timeout 10m + grace 3s + slack 5m
		{"activeDeadlineSeconds", *ps.ActiveDeadlineSeconds, int64(903)},
		{"image", run.Image, "taskrun/testbox:local"},
		{"pullPolicy", run.ImagePullPolicy, corev1.PullNever},
		{"command", run.Command, []string{podhelper.Path, "gate", "--", "/.taskrun/bin/taskrun-probe", "--", "sh", "-c", "echo hi"}},
		{"args", run.Args, []string(nil)},
		{"workingDir", run.WorkingDir, "/taskrun/home"},
		{"env", run.Env, []corev1.EnvVar{{Name: "HOME", Value: "/taskrun/home"}, {Name: "A", Value: "b=c"},
			{Name: EnvNodeIP, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}}}},
		{"stdin", run.Stdin && run.StdinOnce && !run.TTY, true},
		{"allowPrivilegeEscalation", *run.SecurityContext.AllowPrivilegeEscalation, false},
		{"privileged", *run.SecurityContext.Privileged, false},
		{"capabilities", run.SecurityContext.Capabilities.Drop, []corev1.Capability{"ALL"}},
		{"capAdd", run.SecurityContext.Capabilities.Add, []corev1.Capability(nil)},
		{"readOnlyRootFilesystem", *run.SecurityContext.ReadOnlyRootFilesystem, true},
		{"cpu limit", run.Resources.Limits.Cpu().String(), "1"},
		{"memory limit", run.Resources.Limits.Memory().Value(), int64(1 << 30)},
		{"ephemeral-storage limit", run.Resources.Limits.StorageEphemeral().Value(), int64(1<<30 + 64<<20 + 64<<20)},
		{"cpu request", run.Resources.Requests.Cpu().String(), "50m"},
		{"memory request", run.Resources.Requests.Memory().String(), "64Mi"},
		{"ephemeral-storage request", run.Resources.Requests.StorageEphemeral().String(), "64Mi"},
		{"init containers", len(ps.InitContainers), 1},
		{"fill", ps.InitContainers[0].Command, podhelper.FillCommand()},
		{"fill stdin", ps.InitContainers[0].Stdin && ps.InitContainers[0].StdinOnce, true},
		{"keep", ps.Containers[1].Command, podhelper.HoldCommand()},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, tc.got, tc.name)
	}
	assert.Equal(t, []corev1.VolumeMount{
		{Name: VolumeBin, MountPath: podhelper.BinDir, ReadOnly: true},
		{Name: VolumeTmp, MountPath: TmpPath},
		{Name: VolumeData, MountPath: "/taskrun", SubPath: "m0"},
		{Name: VolumeData, MountPath: "/.taskrun/bin/taskrun-probe", SubPath: "m1", ReadOnly: true},
	}, run.VolumeMounts)
	for _, v := range ps.Volumes {
		require.NotNil(t, v.EmptyDir, "volume %s: only emptyDir crosses to the node", v.Name)
		require.NotNil(t, v.EmptyDir.SizeLimit, "volume %s has no size limit", v.Name)
	}
	assert.Equal(t, corev1.StorageMediumMemory, ps.Volumes[2].EmptyDir.Medium)
	assert.Equal(t, int64(sandbox.DefaultTmpfsSizeBytes), ps.Volumes[2].EmptyDir.SizeLimit.Value())
	assert.Equal(t, int64(1<<30), ps.Volumes[0].EmptyDir.SizeLimit.Value())
	for _, c := range append(ps.InitContainers, ps.Containers...) {
		assert.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop, c.Name)
		assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation, c.Name)
		assert.NotNil(t, c.Resources.Limits.Memory(), c.Name)
		assert.False(t, c.Resources.Limits.Cpu().IsZero(), c.Name)
	}
}

func TestConvertLabelsAndAnnotations(t *testing.T) {
	cv := mustConvert(t, testSpec(), sandbox.DefaultPolicy(), testConfig())
	pod := cv.Pod
	want := map[string]string{
		sandbox.LabelManaged:      "true",
		sandbox.LabelTenant:       "u1",
		sandbox.LabelConversation: "c1",
		sandbox.LabelTask:         "t1",
		sandbox.LabelRun:          "Run_42",
		sandbox.LabelInstance:     "inst1",
		LabelPod:                  "taskrun-run-42-abcd1234",
		"team":                    "x",
	}
	assert.Equal(t, want, pod.Labels)
	// Times and paths are not label values: annotations hold every value.
	assert.Equal(t, "2026-01-02T03:04:05Z", pod.Annotations[sandbox.LabelCreated])
	assert.Equal(t, "2026-01-02T03:19:08Z", pod.Annotations[sandbox.LabelExpires])
	assert.Equal(t, "/runs/r1", pod.Annotations[sandbox.LabelRunDir])
	for k, v := range want {
		assert.Equal(t, v, pod.Annotations[k], k)
	}

	t.Run("spec cannot forge the instance or managed labels", func(t *testing.T) {
		spec := testSpec()
		spec.Labels = map[string]string{sandbox.LabelInstance: "other", sandbox.LabelManaged: "false", sandbox.LabelExpires: "2000-01-01T00:00:00Z"}
		cfg := testConfig()
		cfg.Instance = ""
		spec.Timeout = 0
		pod := mustConvert(t, spec, sandbox.DefaultPolicy(), cfg).Pod
		assert.NotContains(t, pod.Labels, sandbox.LabelInstance)
		assert.NotContains(t, pod.Annotations, sandbox.LabelExpires)
		assert.Equal(t, "true", pod.Labels[sandbox.LabelManaged])
		assert.Nil(t, pod.Spec.ActiveDeadlineSeconds)
	})
	t.Run("the executor's process record and host are annotations, never forged", func(t *testing.T) {
		spec := testSpec()
		spec.Labels = map[string]string{sandbox.LabelInstanceProcess: "1/2/forged", LabelInstanceHost: "forged"}
		cfg := testConfig()
		cfg.InstanceProcess, cfg.InstanceHost = "123/456/boot-id", "host1"
		pod := mustConvert(t, spec, sandbox.DefaultPolicy(), cfg).Pod
		assert.Equal(t, "123/456/boot-id", pod.Annotations[sandbox.LabelInstanceProcess])
		assert.Equal(t, "host1", pod.Annotations[LabelInstanceHost])
		assert.NotContains(t, pod.Labels, sandbox.LabelInstanceProcess, "a process record is no label value")

		cfg.InstanceProcess = ""
		pod = mustConvert(t, spec, sandbox.DefaultPolicy(), cfg).Pod
		assert.NotContains(t, pod.Annotations, sandbox.LabelInstanceProcess)
		assert.NotContains(t, pod.Annotations, LabelInstanceHost)
	})
	t.Run("a run ID that is no label value is an annotation only", func(t *testing.T) {
		spec := testSpec()
		spec.Run.RunID = "_starts_with_underscore"
		pod := mustConvert(t, spec, sandbox.DefaultPolicy(), testConfig()).Pod
		assert.NotContains(t, pod.Labels, sandbox.LabelRun)
		assert.Equal(t, "_starts_with_underscore", pod.Annotations[sandbox.LabelRun])
	})
}

func TestConvertNetworkPolicyDeniesAll(t *testing.T) {
	cv := mustConvert(t, testSpec(), sandbox.DefaultPolicy(), testConfig())
	np := cv.NetworkPolicy
	assert.Equal(t, cv.Pod.Name, np.Name)
	assert.Equal(t, "runs", np.Namespace)
	assert.Equal(t, map[string]string{LabelPod: cv.Pod.Name}, np.Spec.PodSelector.MatchLabels)
	assert.Equal(t, cv.Pod.Labels[LabelPod], np.Spec.PodSelector.MatchLabels[LabelPod], "the policy must select the run's Pod")
	assert.ElementsMatch(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, np.Spec.PolicyTypes)
	assert.Empty(t, np.Spec.Egress, "an egress rule would allow traffic")
	assert.Empty(t, np.Spec.Ingress, "an ingress rule would allow traffic")
	assert.Equal(t, cv.Pod.Labels, np.Labels)
}

func TestConvertOptions(t *testing.T) {
	cfg := testConfig()
	cfg.RuntimeClass = "gvisor"
	cfg.SeccompLocalhost = "taskrun/seccomp.json"
	cfg.AckIdle = 1500 * time.Millisecond
	pol := sandbox.DefaultPolicy()
	pol.User = "20001:30001"
	pol.NanoCPUs = 250_000_000
	pol.MemoryBytes = 32 << 20
	pod := mustConvert(t, testSpec(), pol, cfg).Pod
	assert.Equal(t, "gvisor", *pod.Spec.RuntimeClassName)
	assert.Equal(t, corev1.SeccompProfileTypeLocalhost, pod.Spec.SecurityContext.SeccompProfile.Type)
	assert.Equal(t, "taskrun/seccomp.json", *pod.Spec.SecurityContext.SeccompProfile.LocalhostProfile)
	assert.Equal(t, int64(20001), *pod.Spec.SecurityContext.RunAsUser)
	assert.Equal(t, int64(30001), *pod.Spec.SecurityContext.RunAsGroup)
	run := runContainer(t, pod)
	assert.Equal(t, "250m", run.Resources.Limits.Cpu().String())
	assert.Equal(t, []string{podhelper.Path, "gate", "--ack-idle", "1.5s", "--", "/.taskrun/bin/taskrun-probe", "--", "sh", "-c", "echo hi"},
		run.Command)
	// Requests never exceed limits.
	assert.Equal(t, "32Mi", run.Resources.Requests.Memory().String())
}

func TestConvertRefusesWhatAPodCannotExpress(t *testing.T) {
	tests := []struct {
		name string
		edit func(*sandbox.Spec, *sandbox.Policy)
	}{
		{"user name", func(_ *sandbox.Spec, p *sandbox.Policy) { p.User = "agent" }},
		{"root group only", func(_ *sandbox.Spec, p *sandbox.Policy) { p.User = "0:10001" }},
		{"no command", func(s *sandbox.Spec, _ *sandbox.Policy) { s.Cmd = nil }},
		{"env without =", func(s *sandbox.Spec, _ *sandbox.Policy) { s.Env = []string{"NOPE"} }},
		{"relative mount", func(s *sandbox.Spec, _ *sandbox.Policy) { s.Mounts[0].Source = "runs/r1" }},
		{"reserved target", func(s *sandbox.Spec, _ *sandbox.Policy) { s.Mounts[0].Target = podhelper.BinDir }},
		{"invalid label key", func(s *sandbox.Spec, _ *sandbox.Policy) { s.Labels = map[string]string{"bad key": "x"} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, pol := testSpec(), sandbox.DefaultPolicy()
			tc.edit(&spec, &pol)
			_, err := convert(spec, pol, testConfig())
			require.Error(t, err)
		})
	}
}

func TestPodName(t *testing.T) {
	assert.Equal(t, "taskrun-run-42-abcd", podName("taskrun-Run_42", "abcd"))
	assert.Equal(t, "taskrun-abcd", podName("", "abcd"))
	assert.Equal(t, "taskrun-abcd", podName("__", "abcd"))
	long := podName("x"+string(make([]byte, 0))+"-"+repeat("a", 100), "abcd1234")
	assert.LessOrEqual(t, len(long), 63)
	assert.Regexp(t, `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, long)
}

func repeat(s string, n int) string {
	out := ""
	for range n {
		out += s
	}
	return out
}

// restrictedViolations evaluates pod against Pod Security "restricted" at
// the latest version with the admission controller's own checks.
func restrictedViolations(t *testing.T, pod *corev1.Pod) []string {
	t.Helper()
	ev, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	require.NoError(t, err)
	res := ev.EvaluatePod(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}, &pod.ObjectMeta, &pod.Spec)
	var out []string
	for _, r := range res {
		if !r.Allowed {
			out = append(out, r.ForbiddenReason+": "+r.ForbiddenDetail)
		}
	}
	return out
}

func TestConvertedPodsPassRestricted(t *testing.T) {
	variants := map[string]func(*sandbox.Spec, *sandbox.Policy, *podConfig){
		"default":           func(*sandbox.Spec, *sandbox.Policy, *podConfig) {},
		"gvisor":            func(_ *sandbox.Spec, _ *sandbox.Policy, c *podConfig) { c.RuntimeClass = "gvisor" },
		"localhost seccomp": func(_ *sandbox.Spec, _ *sandbox.Policy, c *podConfig) { c.SeccompLocalhost = "taskrun.json" },
		"writable rootfs":   func(_ *sandbox.Spec, p *sandbox.Policy, _ *podConfig) { p.ReadOnlyRootfs = false },
		"no mounts":         func(s *sandbox.Spec, _ *sandbox.Policy, _ *podConfig) { s.Mounts = nil },
	}
	for name, edit := range variants {
		t.Run(name, func(t *testing.T) {
			spec, pol, cfg := testSpec(), sandbox.DefaultPolicy(), testConfig()
			edit(&spec, &pol, &cfg)
			pod := mustConvert(t, spec, pol, cfg).Pod
			assert.Empty(t, restrictedViolations(t, pod))
		})
	}
}

// TestRestrictedCheckCatchesLoosenedPods shows the check above can fail: each
// loosening of a converted Pod is a violation.
func TestRestrictedCheckCatchesLoosenedPods(t *testing.T) {
	tr := true
	zero := int64(0)
	loosen := map[string]func(*corev1.Pod){
		"privilege escalation": func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = &tr },
		"privileged":           func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.Privileged = &tr },
		"capability added": func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_RAW"}
		},
		"capabilities kept": func(p *corev1.Pod) { p.Spec.InitContainers[0].SecurityContext.Capabilities = nil },
		"host network":      func(p *corev1.Pod) { p.Spec.HostNetwork = true },
		"host pid":          func(p *corev1.Pod) { p.Spec.HostPID = true },
		"root user":         func(p *corev1.Pod) { p.Spec.SecurityContext.RunAsUser = &zero },
		"seccomp unconfined": func(p *corev1.Pod) {
			p.Spec.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		},
		"host path": func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		},
	}
	for name, edit := range loosen {
		t.Run(name, func(t *testing.T) {
			pod := mustConvert(t, testSpec(), sandbox.DefaultPolicy(), testConfig()).Pod
			edit(pod)
			assert.NotEmpty(t, restrictedViolations(t, pod))
		})
	}
}

func TestPostureFromConvertedPod(t *testing.T) {
	cfg := testConfig()
	cfg.RuntimeClass = "gvisor"
	pod := mustConvert(t, testSpec(), sandbox.DefaultPolicy(), cfg).Pod
	p, err := PostureFromPod(pod)
	require.NoError(t, err)
	assert.Equal(t, "10001:10001", p.User)
	assert.Equal(t, []string{"ALL"}, p.CapDrop)
	assert.Empty(t, p.CapAdd)
	assert.False(t, p.Privileged)
	assert.Equal(t, []string{"no-new-privileges", "seccomp=runtime/default"}, p.SecurityOpt)
	assert.True(t, p.ReadonlyRootfs)
	assert.Equal(t, int64(1<<30), p.Memory)
	assert.Equal(t, int64(1_000_000_000), p.NanoCPUs)
	assert.Nil(t, p.PidsLimit, "a Pod sets no pids limit")
	assert.Equal(t, NetworkPod, p.NetworkMode)
	assert.Equal(t, "gvisor", p.Runtime)
	assert.Equal(t, "no", p.RestartPolicy)
	assert.Equal(t, "Run_42", p.Labels[sandbox.LabelRun])
	assert.Equal(t, "/runs/r1", p.Labels[sandbox.LabelRunDir])
	assert.Equal(t, map[string]string{TmpPath: "rw,size=67108864"}, p.Tmpfs)
	assert.Contains(t, p.Mounts, sandbox.PostureMount{Type: "emptyDir", Source: VolumeData + "/m0", Destination: "/taskrun", RW: true})
	assert.Equal(t, sandbox.BackendKubernetes, p.Kind())
	assert.Equal(t, "Default", p.ProcMount)
	assert.Positive(t, p.EphemeralStorage)
	assert.False(t, p.ServiceAccountToken)
	var gaps []string
	for _, g := range p.Gaps {
		assert.NotEmpty(t, g.Reason)
		gaps = append(gaps, g.Rule)
	}
	assert.Equal(t, []string{"5.29", "5.19", "TR:seccomp-profile"}, gaps, "what a Pod does not enforce is declared")
	np := NetworkPolicyFacts(mustConvert(t, testSpec(), sandbox.DefaultPolicy(), cfg).NetworkPolicy)
	assert.Equal(t, map[string]string{LabelPod: pod.Name}, np.PodSelector)
	assert.Equal(t, []string{"Ingress", "Egress"}, np.PolicyTypes)
	assert.Zero(t, np.IngressRules+np.EgressRules)

	local := testConfig()
	local.SeccompLocalhost = "taskrun/taskrun-v1.json"
	lp, err := PostureFromPod(mustConvert(t, testSpec(), sandbox.DefaultPolicy(), local).Pod)
	require.NoError(t, err)
	assert.Len(t, lp.Gaps, 2, "taskrun's Localhost profile is no gap")

	tok := true
	pod.Spec.AutomountServiceAccountToken = &tok
	pod.Spec.Containers[0].SecurityContext.ProcMount = ptrTo(corev1.UnmaskedProcMount)
	p, err = PostureFromPod(pod)
	require.NoError(t, err)
	assert.True(t, p.ServiceAccountToken)
	assert.Equal(t, "Unmasked", p.ProcMount)

	pod.Spec.HostNetwork = true
	pod.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
	p, err = PostureFromPod(pod)
	require.NoError(t, err)
	assert.Equal(t, NetworkHost, p.NetworkMode)
	assert.Equal(t, []string{"SYS_ADMIN"}, p.CapAdd)

	pod.Spec.Containers = pod.Spec.Containers[1:]
	_, err = PostureFromPod(pod)
	require.ErrorIs(t, err, ErrNoRunContainer)
}

func TestConvertServesSocketsFromTheKeeperAlone(t *testing.T) {
	cfg := testConfig()
	cfg.Sockets = []string{podhelper.DataDir + "/m0/.gateway/gw.sock"}
	pod := mustConvert(t, testSpec(), sandbox.DefaultPolicy(), cfg).Pod
	keep := pod.Spec.Containers[1]
	assert.Equal(t, podhelper.HoldCommand(cfg.Sockets...), keep.Command)
	assert.Contains(t, keep.VolumeMounts, corev1.VolumeMount{Name: VolumeTunnel, MountPath: podhelper.TunnelDir})
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers[0]) {
		for _, m := range c.VolumeMounts {
			assert.NotEqual(t, VolumeTunnel, m.Name, "container %s must not reach the tunnel's control socket", c.Name)
		}
	}
	assert.Empty(t, restrictedViolations(t, pod))
}

func ptrTo[T any](v T) *T { return &v }

// The kubelet expands $(VAR) in a container's command and env values; the
// Docker engine does not. A run's text reaches its shell as it was written.
func TestConvertEscapesKubeletExpansion(t *testing.T) {
	spec := testSpec()
	spec.Cmd = []string{"sh", "-c", "echo pid=$$; echo sub=$(HOME)"}
	spec.Env = append(spec.Env, "DOLLAR=a$(HOME)b$$c")
	c := runContainer(t, mustConvert(t, spec, sandbox.DefaultPolicy(), testConfig()).Pod)
	assert.Equal(t, "echo pid=$$$$; echo sub=$$(HOME)", c.Command[len(c.Command)-1])
	var dollar string
	for _, e := range c.Env {
		if e.Name == "DOLLAR" {
			dollar = e.Value
		}
	}
	assert.Equal(t, "a$$(HOME)b$$$$c", dollar)
}

// TestRunDiskCapSizesTheDataVolume checks a run's --disk reaches the Pod: the
// data volume and the ephemeral-storage limit follow the Spec's DiskBytes,
// and the backend's default applies only when the run names none.
func TestRunDiskCapSizesTheDataVolume(t *testing.T) {
	b := &Backend{diskBytes: DefaultDiskBytes, logBytes: 64 << 20}
	volume := func(spec sandbox.Spec) *corev1.EmptyDirVolumeSource {
		cv := mustConvert(t, spec, sandbox.DefaultPolicy(), b.podConfig(spec, "", created))
		for _, v := range cv.Pod.Spec.Volumes {
			if v.Name == VolumeData {
				return v.EmptyDir
			}
		}
		t.Fatalf("no %s volume", VolumeData)
		return nil
	}
	spec := testSpec()
	spec.DiskBytes = 64 << 20
	got := volume(spec)
	require.NotNil(t, got.SizeLimit)
	assert.Equal(t, int64(64<<20), got.SizeLimit.Value())

	spec.DiskBytes = 0
	got = volume(spec)
	require.NotNil(t, got.SizeLimit)
	assert.Equal(t, int64(DefaultDiskBytes), got.SizeLimit.Value(), "no run cap: the backend's default")
}

func TestRunDeadlineCoversTheExecutorsBudget(t *testing.T) {
	b := &Backend{expirySlack: time.Minute, startTimeout: 2 * time.Minute, apiOutage: 10 * time.Minute, stopGrace: DefaultStopGrace}
	spec := testSpec()
	spec.Timeout = time.Minute
	spec.StopGrace = 2500 * time.Millisecond
	cfg := b.podConfig(spec, "", created)
	cv := mustConvert(t, spec, sandbox.DefaultPolicy(), cfg)
	require.NotNil(t, cv.Pod.Spec.ActiveDeadlineSeconds)
	deadline := time.Duration(*cv.Pod.Spec.ActiveDeadlineSeconds) * time.Second
	// What the executor may spend on the run: start, timeout, stop, the
	// wait for the exit and the copy-out across an outage.
	own := b.startTimeout + spec.Timeout + 2*spec.StopGrace + 3*cleanupTimeout + b.apiOutage
	assert.GreaterOrEqual(t, deadline, own, "the cluster never stops a Pod its executor is still entitled to")
	expires, err := time.Parse(time.RFC3339, cv.Pod.Annotations[sandbox.LabelExpires])
	require.NoError(t, err)
	assert.Equal(t, deadline, expires.Sub(created), "the reaper's expiry is the cluster's deadline")

	b.expirySlack = time.Hour
	cv = mustConvert(t, spec, sandbox.DefaultPolicy(), b.podConfig(spec, "", created))
	assert.Equal(t, int64((spec.Timeout+3*time.Second+time.Hour)/time.Second), *cv.Pod.Spec.ActiveDeadlineSeconds,
		"a larger slack is kept, the deadline rounded up to whole seconds")
}
