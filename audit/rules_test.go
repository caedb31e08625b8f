package audit

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/docker/docker/api/types/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/sandbox/seccomp"
)

func ptr[T any](v T) *T { return &v }

// compliant is a posture that passes every rule under DefaultOptions on a
// host with seccomp and AppArmor.
func compliant() Posture {
	return Posture{
		ID:              "c0ffee",
		Labels:          map[string]string{sandbox.LabelManaged: "true", sandbox.LabelRun: "run-1"},
		User:            "10001:10001",
		WorkingDir:      "/taskrun/home",
		CapDrop:         []string{"ALL"},
		SecurityOpt:     []string{"no-new-privileges", "seccomp=" + seccomp.SHA256()},
		AppArmorProfile: "docker-default",
		ReadonlyRootfs:  true,
		Memory:          1 << 30,
		MemorySwap:      1 << 30,
		NanoCPUs:        1e9,
		PidsLimit:       ptr(int64(256)),
		NetworkMode:     "none",
		IpcMode:         "private",
		Mounts: []Mount{
			{Type: "bind", Source: "/srv/taskrun/users/u/conversations/c/tasks/t/runs/run-1", Destination: "/taskrun", RW: true, Propagation: "rprivate"},
			{Type: "bind", Source: "/var/lib/taskrun/bin/taskrun-probe", Destination: "/.taskrun/bin/taskrun-probe", Propagation: "rprivate"},
		},
		Tmpfs:         map[string]string{"/tmp": "rw,exec,nosuid,nodev,size=268435456"},
		RestartPolicy: "no",
		MaskedPaths:   []string{"/proc/kcore", "/proc/keys"},
		ReadonlyPaths: []string{"/proc/bus", "/proc/sys"},
		LogDriver:     "json-file",
		LogOpts:       map[string]string{"max-size": "10m"},
		Runtime:       "runc",
		Ulimits:       []Ulimit{{Name: "nofile", Soft: 1024, Hard: 1024}, {Name: "core"}},
	}
}

var fullHost = HostFacts{AppArmor: true, Seccomp: true}

func TestCompliantPassesEveryRule(t *testing.T) {
	r := Check(compliant(), fullHost, Options{})
	require.Len(t, r.Findings, len(RuleIDs()))
	assert.Empty(t, r.FailedIDs())
	assert.False(t, r.Failed())
	for _, f := range r.Findings {
		if f.ID == "TR:gvisor" {
			assert.Equal(t, NotApplicable, f.Status, "gVisor not required")
			continue
		}
		if f.ID == "PSS:namespace-restricted" {
			assert.Equal(t, NotApplicable, f.Status, "no cluster admits a Docker container")
			continue
		}
		assert.Equal(t, Pass, f.Status, "%s: %s", f.ID, f.Reason)
	}
}

func TestEachBreakFailsExactlyItsRule(t *testing.T) {
	src := func(s string) func(*Posture) {
		return func(p *Posture) {
			p.Mounts = append(p.Mounts, Mount{Type: "bind", Source: s, Destination: "/x", RW: true})
		}
	}
	cases := []struct {
		rule   string
		break_ func(*Posture)
	}{
		{"5.5", func(p *Posture) { p.Privileged = true }},
		{"5.4", func(p *Posture) { p.CapAdd = []string{"SYS_ADMIN"} }},
		{"PSS:capabilities-drop-all", func(p *Posture) { p.CapDrop = []string{"NET_RAW"} }},
		{"5.26", func(p *Posture) { p.SecurityOpt = p.SecurityOpt[1:] }},
		{"5.26", func(p *Posture) { p.SecurityOpt[0] = "no-new-privileges:false" }},
		{"5.26", func(p *Posture) { p.SecurityOpt = append(p.SecurityOpt, "no-new-privileges=false") }},
		{"TR:seccomp-profile", func(p *Posture) { p.SecurityOpt = p.SecurityOpt[:1] }},
		{"TR:seccomp-profile", func(p *Posture) { p.SecurityOpt[1] = "seccomp=" + seccomp.Digest([]byte("{}")) }},
		{"TR:seccomp-profile", func(p *Posture) { p.SecurityOpt = append(p.SecurityOpt, "seccomp=/etc/docker/seccomp.json") }},
		{"5.2", func(p *Posture) { p.AppArmorProfile = "unconfined" }},
		{"5.2", func(p *Posture) { p.SecurityOpt = append(p.SecurityOpt, "apparmor=unconfined") }},
		{"5.13", func(p *Posture) { p.ReadonlyRootfs = false }},
		{"5.11", func(p *Posture) { p.Memory, p.MemorySwap = 0, 0 }},
		{"TR:no-swap", func(p *Posture) { p.MemorySwap = -1 }},
		{"5.12", func(p *Posture) { p.NanoCPUs = 0 }},
		{"5.29", func(p *Posture) { p.PidsLimit = ptr(int64(-1)) }},
		{"5.29", func(p *Posture) { p.PidsLimit = nil }},
		{"5.10", func(p *Posture) { p.NetworkMode = "host" }},
		{"5.10", func(p *Posture) { p.NetworkMode = "bridge" }},
		{"5.16", func(p *Posture) { p.PidMode = "host" }},
		{"5.16", func(p *Posture) { p.PidMode = "container:abc" }},
		{"5.17", func(p *Posture) { p.IpcMode = "host" }},
		{"5.17", func(p *Posture) { p.IpcMode = "shareable" }},
		{"5.21", func(p *Posture) { p.UTSMode = "host" }},
		{"5.31", func(p *Posture) { p.UsernsMode = "host" }},
		{"5.32", src("/var/run/docker.sock")},
		{"5.32", src("/run/containerd/containerd.sock")},
		{"5.32", src("/home/u/.local/share/containers/podman.sock")},
		{"5.32", src("/run")},
		{"5.6", src("/etc")},
		{"5.6", src("/etc/ssh")},
		{"5.6", src("/")},
		{"5.6", src("/proc/1/root")},
		{"5.20", func(p *Posture) { p.Mounts[0].Propagation = "rshared" }},
		{"TR:only-run-mount", src("/srv/other-tenant")},
		{"TR:only-run-mount", func(p *Posture) { p.Mounts[0].Source = "/srv/taskrun/users/u/runs/run-2" }},
		{"TR:only-run-mount", func(p *Posture) { p.Mounts[1].RW = true }},
		{"TR:only-run-mount", func(p *Posture) {
			p.Mounts = append(p.Mounts, Mount{Type: "volume", Source: "/var/lib/docker/volumes/v/_data", Destination: "/data", RW: true})
		}},
		{"TR:tmpfs", func(p *Posture) { p.Tmpfs["/tmp"] = "rw,nodev,size=16m" }},
		{"TR:tmpfs", func(p *Posture) { p.Tmpfs["/tmp"] = "rw,nosuid,size=16m" }},
		{"TR:tmpfs", func(p *Posture) { p.Tmpfs["/tmp"] = "rw,nosuid,nodev" }},
		{"TR:tmpfs", func(p *Posture) { p.Tmpfs["/tmp"] = "rw,nosuid,nodev,size=0" }},
		{"TR:tmpfs", func(p *Posture) { p.Tmpfs["/tmp"] = "" }},
		{"TR:tmpfs", func(p *Posture) { p.Tmpfs["/tmp"] = "nosuid,nodev,size=16m,suid" }},
		{"TR:tmpfs", func(p *Posture) { p.Tmpfs["/tmp"] = "nosuid,nodev,size=16m,dev" }},
		{"TR:tmpfs", func(p *Posture) { p.Tmpfs["/scratch"] = "rw" }},
		{"TR:tmpfs", func(p *Posture) { p.Mounts = append(p.Mounts, Mount{Type: "tmpfs", Destination: "/scratch", RW: true}) }},
		{"5.18", func(p *Posture) { p.Devices = []string{"/dev/null:/dev/null"} }},
		{"5.18", func(p *Posture) { p.DeviceRequests = 1 }},
		{"5.8", func(p *Posture) { p.PortBindings = []string{"80/tcp->:8080"} }},
		{"5.8", func(p *Posture) { p.PublishAllPorts = true }},
		{"5.15", func(p *Posture) { p.RestartPolicy = "always" }},
		{"5.25", func(p *Posture) { p.CgroupParent = "/custom" }},
		{"PSS:runAsNonRoot", func(p *Posture) { p.User = "" }},
		{"PSS:runAsNonRoot", func(p *Posture) { p.User = "0:0" }},
		{"PSS:runAsNonRoot", func(p *Posture) { p.User = "root" }},
		{"TR:proc-masking", func(p *Posture) { p.MaskedPaths = nil }},
		{"TR:proc-masking", func(p *Posture) { p.ReadonlyPaths = []string{"/proc/bus"} }},
		{"TR:log-capped", func(p *Posture) { p.LogOpts = nil }},
		{"TR:log-capped", func(p *Posture) { p.LogOpts = map[string]string{"max-size": "-1"} }},
		{"TR:log-capped", func(p *Posture) { p.LogDriver = "syslog" }},
		{"TR:workdir-not-proc", func(p *Posture) { p.WorkingDir = "/proc/self/fd/7" }},
		{"TR:workdir-not-proc", func(p *Posture) { p.WorkingDir = "/taskrun/../proc/self" }},
		{"5.19", func(p *Posture) { p.Ulimits = nil }},
	}
	for _, tc := range cases {
		p := compliant()
		tc.break_(&p)
		r := Check(p, fullHost, Options{})
		assert.Equal(t, []string{tc.rule}, r.FailedIDs(), "break for %s", tc.rule)
		assert.True(t, r.Failed())
	}
}

func TestNamedVolumeWithoutSourceNotAllowed(t *testing.T) {
	p := compliant()
	p.Mounts = append(p.Mounts, Mount{Type: "volume", Destination: "/cache", RW: true})
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(p, fullHost, Options{}).FailedIDs())
}

func TestAppArmorNotApplicableWithoutHostSupport(t *testing.T) {
	p := compliant()
	p.AppArmorProfile = ""
	r := Check(p, HostFacts{Seccomp: true}, Options{})
	assert.Empty(t, r.FailedIDs())
	f := findingByID(t, r, "5.2")
	assert.Equal(t, NotApplicable, f.Status)
	pass, _, na := r.Counts()
	assert.Equal(t, len(RuleIDs())-3, pass, "NOT_APPLICABLE is not counted as a pass")
	assert.Equal(t, 3, na, "AppArmor, gVisor not required, and namespace admission")
}

func TestSeccompDependsOnHost(t *testing.T) {
	p := compliant()
	p.SecurityOpt = p.SecurityOpt[:1]
	r := Check(p, HostFacts{AppArmor: true}, Options{})
	assert.Equal(t, []string{"5.22", "TR:seccomp-profile"}, r.FailedIDs(), "no seccomp on the host and no explicit profile")
	assert.Equal(t, []string{"TR:seccomp-profile"}, Check(p, fullHost, Options{}).FailedIDs(), "the daemon's default profile is not taskrun's")
}

func TestUnconfinedSeccompFailsBothSeccompRules(t *testing.T) {
	for _, opt := range []string{"seccomp=unconfined", "seccomp:unconfined"} {
		p := compliant()
		p.SecurityOpt = append(p.SecurityOpt, opt)
		assert.Equal(t, []string{"5.22", "TR:seccomp-profile"}, Check(p, fullHost, Options{}).FailedIDs(), opt)
	}
}

func TestSeccompProfileIsComparedByDigest(t *testing.T) {
	p := compliant()
	p.SecurityOpt[1] = "seccomp=" + string(seccomp.JSON())
	assert.Empty(t, Check(p, fullHost, Options{}).FailedIDs(), "an inline profile is digested")

	other := SeccompProfile{Name: "custom", SHA256: seccomp.Digest([]byte("{}"))}
	p.SecurityOpt[1] = "seccomp=" + other.SHA256
	assert.Empty(t, Check(p, fullHost, Options{SeccompProfile: other}).FailedIDs(), "the options name the required profile")
	f := findingByID(t, Check(p, fullHost, Options{}), "TR:seccomp-profile")
	assert.Equal(t, Fail, f.Status)
	assert.Contains(t, f.Reason, seccomp.Name)
}

func TestOptions(t *testing.T) {
	p := compliant()
	p.NetworkMode = "taskrun-internal"
	assert.Equal(t, []string{"5.10"}, Check(p, fullHost, Options{}).FailedIDs())
	assert.Empty(t, Check(p, fullHost, Options{AllowedNetworkModes: []string{"taskrun-internal"}}).FailedIDs())

	p = compliant()
	assert.Equal(t, []string{"TR:gvisor"}, Check(p, fullHost, Options{RequireGVisor: true}).FailedIDs())
	p.Runtime = "runsc"
	r := Check(p, fullHost, Options{RequireGVisor: true})
	assert.Empty(t, r.FailedIDs())
	assert.Equal(t, Pass, findingByID(t, r, "TR:gvisor").Status)
	// A sandbox restored from its checkpoint runs under the restore
	// runtime, runsc behind it; any other runtime name is not gVisor.
	p.Runtime = sandbox.RuntimeGVisorRestore
	assert.Empty(t, Check(p, fullHost, Options{RequireGVisor: true}).FailedIDs())
	p.Runtime = "runsc-but-not-really"
	assert.Equal(t, []string{"TR:gvisor"}, Check(p, fullHost, Options{RequireGVisor: true}).FailedIDs())

	p = compliant()
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(p, fullHost, Options{Mounts: MountPolicy{ForbidHelpers: true}}).FailedIDs())
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(p, fullHost, Options{Mounts: MountPolicy{RunsRoot: "/var/lib/taskrun"}}).FailedIDs())
	assert.Empty(t, Check(p, fullHost, Options{Mounts: MountPolicy{RunsRoot: "/srv/taskrun"}}).FailedIDs())
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(p, fullHost, Options{Mounts: MountPolicy{RunDir: "/srv/elsewhere/run-1"}}).FailedIDs())
}

func TestRunDirStrictlyBelowRunsRoot(t *testing.T) {
	p := compliant()
	p.Mounts[0].Source = "/srv/taskrun/runs"
	p.Labels[sandbox.LabelRun] = "runs"
	assert.Empty(t, Check(p, fullHost, Options{}).FailedIDs(), "without RunsRoot the run ID rule decides")
	for _, mp := range []MountPolicy{
		{RunsRoot: "/srv/taskrun/runs"},
		{RunsRoot: "/srv/taskrun/runs/"},
		{RunsRoot: "/srv/taskrun/runs", RunDir: "/srv/taskrun/runs"},
	} {
		assert.Equal(t, []string{"TR:only-run-mount"}, Check(p, fullHost, Options{Mounts: mp}).FailedIDs(), "%+v: the runs root itself holds every run", mp)
	}
	assert.Empty(t, Check(p, fullHost, Options{Mounts: MountPolicy{RunsRoot: "/srv/taskrun"}}).FailedIDs())
}

func TestHelpersDir(t *testing.T) {
	p := compliant() // helper from /var/lib/taskrun/bin/taskrun-probe
	cases := []struct {
		dir, src string
		ok       bool
	}{
		{"/var/lib/taskrun/bin", "/var/lib/taskrun/bin/taskrun-probe", true},
		{"/var/lib/taskrun/bin/", "/var/lib/taskrun/bin/taskrun-probe", true},
		{"/var/lib/taskrun/bin", "/var/lib/taskrun/bin", true},
		{"/var/lib/taskrun/bin", "/var/lib/taskrun/binx/taskrun-probe", false},
		{"/var/lib/taskrun/bin", "/home/u/evil/taskrun-probe", false},
		{"/var/lib/taskrun/bin", "/var/lib/taskrun/bin/../runs/x", false},
		{"", "/home/u/evil/taskrun-probe", true},
	}
	for _, tc := range cases {
		p.Mounts[1].Source = tc.src
		r := Check(p, fullHost, Options{Mounts: MountPolicy{HelpersDir: tc.dir}})
		if tc.ok {
			assert.Empty(t, r.FailedIDs(), "%+v", tc)
		} else {
			assert.Equal(t, []string{"TR:only-run-mount"}, r.FailedIDs(), "%+v", tc)
		}
	}
	p = compliant()
	p.Mounts[1].RW = true
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(p, fullHost, Options{}).FailedIDs(), "helpers are read-only even without HelpersDir")
}

func TestTmpfsOptionsAccepted(t *testing.T) {
	for _, opts := range []string{
		"rw,exec,nosuid,nodev,size=268435456", // the executor's format
		"rw,nosuid,nodev,size=16m",
		"nodev,nosuid,size=65536k",
		"suid,nosuid,dev,nodev,size=50%",
	} {
		p := compliant()
		p.Tmpfs["/tmp"] = opts
		assert.Empty(t, Check(p, fullHost, Options{}).FailedIDs(), opts)
	}
}

func TestRunDirFromLabels(t *testing.T) {
	rooted := Options{Mounts: MountPolicy{RunsRoot: "/srv/taskrun"}}
	p := compliant()
	p.Labels[sandbox.LabelRunDir] = p.Mounts[0].Source
	assert.Empty(t, Check(p, fullHost, rooted).FailedIDs())
	p.Labels[sandbox.LabelRunDir] = "/srv/taskrun/other/run-1"
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(p, fullHost, rooted).FailedIDs(), "a trusted label names another dir")

	// Without RunsRoot, or with a label not strictly below it, the label is
	// not trusted and the run ID rule decides.
	p = compliant()
	p.Labels[sandbox.LabelRunDir] = "/elsewhere"
	p.Mounts[0].Source = "/elsewhere"
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(p, fullHost, Options{}).FailedIDs(), "untrusted label, dir not named after the run")
	p = compliant()
	delete(p.Labels, sandbox.LabelRun)
	p.Labels[sandbox.LabelRunDir] = p.Mounts[0].Source
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(p, fullHost, Options{}).FailedIDs(), "label alone is not trusted without RunsRoot")
	assert.Empty(t, Check(p, fullHost, rooted).FailedIDs(), "label trusted below RunsRoot")
	p.Labels[sandbox.LabelRunDir] = "/srv/taskrun"
	p.Mounts[0].Source = "/srv/taskrun"
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(p, fullHost, rooted).FailedIDs(), "a label equal to RunsRoot is not trusted")

	p = compliant()
	delete(p.Labels, sandbox.LabelRun)
	r := Check(p, fullHost, Options{})
	assert.Equal(t, []string{"TR:only-run-mount"}, r.FailedIDs(), "an unlabelled run dir cannot be tied to the run")
}

func TestHostFactsFromInfo(t *testing.T) {
	h := docker.HostFactsFromInfo(system.Info{ServerVersion: "20.10.24", SecurityOptions: []string{"name=seccomp,profile=default", "name=rootless"}})
	assert.Equal(t, HostFacts{Seccomp: true, Rootless: true, ServerVersion: "20.10.24"}, h)
	h = docker.HostFactsFromInfo(system.Info{SecurityOptions: []string{"name=apparmor", "name=seccomp,profile=builtin", "name=selinux"}})
	assert.Equal(t, HostFacts{AppArmor: true, Seccomp: true, SELinux: true}, h)
}

func TestParseInspect(t *testing.T) {
	raw := []byte(`[{"Id":"abc","Name":"/run-1","AppArmorProfile":"",
	  "Config":{"User":"10001","WorkingDir":"/taskrun/home","Labels":{"dev.taskrun.run":"run-1"}},
	  "HostConfig":{"Privileged":true,"CapAdd":["SYS_ADMIN"],"PidsLimit":256,"Memory":5,"MemorySwap":5,
	    "NetworkMode":"none","PortBindings":{"80/tcp":[{"HostIp":"","HostPort":"8080"}]},
	    "RestartPolicy":{"Name":"always"},"LogConfig":{"Type":"json-file","Config":{"max-size":"10m"}},
	    "Devices":[{"PathOnHost":"/dev/null","PathInContainer":"/dev/null","CgroupPermissions":"rwm"}],
	    "Ulimits":[{"Name":"nofile","Soft":1,"Hard":2}]},
	  "Mounts":[{"Type":"bind","Source":"/a","Destination":"/taskrun","RW":true,"Propagation":"rprivate"}]}]`)
	p, err := docker.ParseInspect(raw)
	require.NoError(t, err)
	assert.Equal(t, "abc", p.ID)
	assert.Equal(t, "run-1", p.Name)
	assert.True(t, p.Privileged)
	assert.Equal(t, []string{"SYS_ADMIN"}, p.CapAdd)
	require.NotNil(t, p.PidsLimit)
	assert.Equal(t, int64(256), *p.PidsLimit)
	assert.Equal(t, []string{"80/tcp->:8080"}, p.PortBindings)
	assert.Equal(t, "always", p.RestartPolicy)
	assert.Equal(t, []string{"/dev/null:/dev/null"}, p.Devices)
	assert.Equal(t, []Ulimit{{Name: "nofile", Soft: 1, Hard: 2}}, p.Ulimits)
	assert.Equal(t, []Mount{{Type: "bind", Source: "/a", Destination: "/taskrun", RW: true, Propagation: "rprivate"}}, p.Mounts)

	_, err = docker.ParseInspect([]byte(`{"Id":"abc"}`))
	assert.ErrorIs(t, err, docker.ErrIncompleteInspect)
	_, err = docker.ParseInspect([]byte(`[]`))
	assert.Error(t, err)
}

func TestPostureJSONRoundTrip(t *testing.T) {
	p := compliant()
	b, err := json.Marshal(p)
	require.NoError(t, err)
	var back Posture
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, p, back)
}

func TestRender(t *testing.T) {
	p := compliant()
	p.Privileged = true
	r := Check(p, HostFacts{Seccomp: true}, Options{})
	var buf bytes.Buffer
	require.NoError(t, r.WriteTable(&buf))
	assert.Contains(t, buf.String(), "RULE")
	assert.Regexp(t, `5\.5\s+CIS 1\.6\.0 §5\s+FAIL\s+not privileged: Privileged is true`, buf.String())
	assert.Regexp(t, `5\.2\s+CIS 1\.6\.0 §5\s+NOT_APPLICABLE`, buf.String())

	buf.Reset()
	require.NoError(t, WriteJSON(&buf, []Report{r}))
	var back []Report
	require.NoError(t, json.Unmarshal(buf.Bytes(), &back))
	require.Len(t, back, 1)
	assert.Equal(t, r, back[0])
}

func findingByID(t *testing.T, r Report, id string) Finding {
	t.Helper()
	for _, f := range r.Findings {
		if f.ID == id {
			return f
		}
	}
	require.Failf(t, "no finding", "rule %s missing", id)
	return Finding{}
}

func TestParseHostInfoReadsSecurityOptions(t *testing.T) {
	h, err := docker.ParseHostInfo([]byte(`{"ServerVersion":"20.10.24","SecurityOptions":["name=seccomp,profile=default","name=apparmor"]}`))
	require.NoError(t, err)
	assert.True(t, h.Seccomp)
	assert.True(t, h.AppArmor)
	assert.Equal(t, "20.10.24", h.ServerVersion)

	_, err = docker.ParseHostInfo([]byte(`not json`))
	require.Error(t, err)
}

func TestHelperFilesPinEachHelperMount(t *testing.T) {
	const exe = "/var/lib/taskrun/helpers/0123/taskrun"
	pins := Options{Mounts: MountPolicy{HelperFiles: map[string]string{
		"/.taskrun/bin/taskrun-probe": exe,
		"/.taskrun/bin/taskrun-relay": exe,
	}}}
	p := compliant()
	p.Mounts[1].Source = exe
	p.Mounts = append(p.Mounts, Mount{Type: "bind", Source: exe, Destination: "/.taskrun/bin/taskrun-relay", Propagation: "rprivate"})
	assert.Empty(t, Check(p, fullHost, pins).FailedIDs())

	other := compliant()
	other.Mounts[1].Source = "/var/lib/taskrun/helpers/0123/other"
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(other, fullHost, pins).FailedIDs(), "a helper from another file")

	extra := compliant()
	extra.Mounts[1].Source = exe
	extra.Mounts = append(extra.Mounts, Mount{Type: "bind", Source: "/var/lib/taskrun/bin", Destination: "/.taskrun/bin/tools"})
	assert.Equal(t, []string{"TR:only-run-mount"}, Check(extra, fullHost, pins).FailedIDs(), "a mount under the helpers path that is no helper")
	assert.Empty(t, Check(extra, fullHost, Options{}).FailedIDs(), "without pins any read-only helper source passes")
}
