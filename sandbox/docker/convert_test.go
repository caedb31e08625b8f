package docker

import (
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/seccomp"
)

func TestConvert(t *testing.T) {
	created := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	const slack = 5 * time.Minute
	base := func() (sandbox.Spec, sandbox.Policy) {
		return sandbox.Spec{
			Image:     "img:tag",
			Cmd:       []string{"run", "agent"},
			Run:       model.RunRef{UserID: "tenant-1", ConversationID: "conv-1", TaskID: "task-1", RunID: "run-1"},
			Timeout:   time.Hour,
			StopGrace: 10 * time.Second,
		}, sandbox.DefaultPolicy()
	}
	tests := []struct {
		name  string
		tweak func(*sandbox.Spec, *sandbox.Policy)
		check func(t *testing.T, cc createConfig)
	}{
		{"policy User", func(_ *sandbox.Spec, p *sandbox.Policy) { p.User = "4242:4343" }, func(t *testing.T, cc createConfig) {
			assert.Equal(t, "4242:4343", cc.Config.User)
		}},
		{"masked paths: Docker's and the host's activity", nil, func(t *testing.T, cc createConfig) {
			for _, p := range []string{"/proc/kcore", "/proc/keys", "/sys/firmware", "/proc/diskstats", "/sys/block", "/sys/devices/virtual/block"} {
				assert.Contains(t, cc.Host.MaskedPaths, p)
			}
			assert.Nil(t, cc.Host.ReadonlyPaths, "Docker's read-only paths stay its default")
		}},
		{"policy ReadOnlyRootfs true", nil, func(t *testing.T, cc createConfig) {
			assert.True(t, cc.Host.ReadonlyRootfs)
		}},
		{"policy ReadOnlyRootfs false", func(_ *sandbox.Spec, p *sandbox.Policy) { p.ReadOnlyRootfs = false }, func(t *testing.T, cc createConfig) {
			assert.False(t, cc.Host.ReadonlyRootfs)
		}},
		{"policy TmpfsSizeBytes", func(_ *sandbox.Spec, p *sandbox.Policy) { p.TmpfsSizeBytes = 12345678 }, func(t *testing.T, cc createConfig) {
			assert.Equal(t, map[string]string{"/tmp": "rw,exec,nosuid,nodev,size=12345678"}, cc.Host.Tmpfs)
		}},
		{"policy PidsLimit", func(_ *sandbox.Spec, p *sandbox.Policy) { p.PidsLimit = 77 }, func(t *testing.T, cc createConfig) {
			require.NotNil(t, cc.Host.PidsLimit)
			assert.Equal(t, int64(77), *cc.Host.PidsLimit)
		}},
		{"policy MemoryBytes caps swap too", func(_ *sandbox.Spec, p *sandbox.Policy) { p.MemoryBytes = 300 << 20 }, func(t *testing.T, cc createConfig) {
			assert.Equal(t, int64(300<<20), cc.Host.Memory)
			assert.Equal(t, int64(300<<20), cc.Host.MemorySwap)
		}},
		{"policy NanoCPUs", func(_ *sandbox.Spec, p *sandbox.Policy) { p.NanoCPUs = 1_500_000_000 }, func(t *testing.T, cc createConfig) {
			assert.Equal(t, int64(1_500_000_000), cc.Host.NanoCPUs)
		}},
		{"policy NetworkMode", nil, func(t *testing.T, cc createConfig) {
			assert.Equal(t, container.NetworkMode("none"), cc.Host.NetworkMode)
			assert.Empty(t, cc.Network.EndpointsConfig)
		}},
		{"policy Runtime default", nil, func(t *testing.T, cc createConfig) {
			assert.Empty(t, cc.Host.Runtime)
		}},
		{"policy Runtime runsc", func(_ *sandbox.Spec, p *sandbox.Policy) { p.Runtime = "runsc" }, func(t *testing.T, cc createConfig) {
			assert.Equal(t, "runsc", cc.Host.Runtime)
		}},
		{"policy NoFile and core=0", func(_ *sandbox.Spec, p *sandbox.Policy) { p.NoFile = 4096 }, func(t *testing.T, cc createConfig) {
			assert.ElementsMatch(t, []*container.Ulimit{
				{Name: "nofile", Soft: 4096, Hard: 4096},
				{Name: "core", Soft: 0, Hard: 0},
			}, cc.Host.Ulimits)
		}},
		{"policy LogMaxSize and LogMaxFile", func(_ *sandbox.Spec, p *sandbox.Policy) { p.LogMaxSize = "3m"; p.LogMaxFile = 4 }, func(t *testing.T, cc createConfig) {
			assert.Equal(t, container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "3m", "max-file": "4"}}, cc.Host.LogConfig)
		}},
		{"fixed CapDrop ALL, no CapAdd, not privileged", nil, func(t *testing.T, cc createConfig) {
			assert.Equal(t, []string{"ALL"}, []string(cc.Host.CapDrop))
			assert.Empty(t, cc.Host.CapAdd)
			assert.False(t, cc.Host.Privileged)
		}},
		{"fixed no-new-privileges, taskrun's seccomp profile, default AppArmor", nil, func(t *testing.T, cc createConfig) {
			assert.Equal(t, []string{"no-new-privileges", "seccomp=" + string(seccomp.JSON())}, cc.Host.SecurityOpt)
		}},
		{"taskrun's seccomp profile under gVisor too", func(_ *sandbox.Spec, p *sandbox.Policy) { p.Runtime = "runsc" }, func(t *testing.T, cc createConfig) {
			assert.Contains(t, cc.Host.SecurityOpt, seccomp.SecurityOpt())
		}},
		{"fixed Init", nil, func(t *testing.T, cc createConfig) {
			require.NotNil(t, cc.Host.Init)
			assert.True(t, *cc.Host.Init)
		}},
		{"fixed private IPC, no host namespaces", nil, func(t *testing.T, cc createConfig) {
			assert.Equal(t, container.IPCModePrivate, cc.Host.IpcMode)
			assert.Empty(t, cc.Host.PidMode)
			assert.Empty(t, cc.Host.UTSMode)
			assert.Empty(t, cc.Host.UsernsMode)
		}},
		{"fixed no ports", nil, func(t *testing.T, cc createConfig) {
			assert.False(t, cc.Host.PublishAllPorts)
			assert.Empty(t, cc.Host.PortBindings)
			assert.Empty(t, cc.Config.ExposedPorts)
		}},
		{"fixed no devices", nil, func(t *testing.T, cc createConfig) {
			assert.Empty(t, cc.Host.Devices)
			assert.Empty(t, cc.Host.DeviceRequests)
			assert.Empty(t, cc.Host.DeviceCgroupRules)
		}},
		{"fixed restart policy no, not auto-removed", nil, func(t *testing.T, cc createConfig) {
			assert.Equal(t, container.RestartPolicyDisabled, cc.Host.RestartPolicy.Name)
			assert.False(t, cc.Host.AutoRemove)
		}},
		{"fixed no binds, no volumes", nil, func(t *testing.T, cc createConfig) {
			assert.Empty(t, cc.Host.Binds)
			assert.Empty(t, cc.Host.VolumesFrom)
			assert.Empty(t, cc.Host.Mounts)
		}},
		{"spec Mounts are rprivate binds", func(s *sandbox.Spec, _ *sandbox.Policy) {
			s.Mounts = []sandbox.Mount{{Source: "/srv/run", Target: "/taskrun"}, {Source: "/srv/helpers", Target: "/opt/h", ReadOnly: true}}
		}, func(t *testing.T, cc createConfig) {
			bind := &mount.BindOptions{Propagation: mount.PropagationRPrivate}
			assert.Equal(t, []mount.Mount{
				{Type: mount.TypeBind, Source: "/srv/run", Target: "/taskrun", BindOptions: bind},
				{Type: mount.TypeBind, Source: "/srv/helpers", Target: "/opt/h", ReadOnly: true, BindOptions: bind},
			}, cc.Host.Mounts)
		}},
		{"spec command, env, workdir, name", func(s *sandbox.Spec, _ *sandbox.Policy) {
			s.Name = "run-1"
			s.Entrypoint = []string{"/bin/sh", "-c"}
			s.Env = []string{"HOME=/taskrun/home"}
			s.WorkingDir = "/taskrun/home"
		}, func(t *testing.T, cc createConfig) {
			assert.Equal(t, "run-1", cc.Name)
			assert.Equal(t, "img:tag", cc.Config.Image)
			assert.Equal(t, []string{"run", "agent"}, []string(cc.Config.Cmd))
			assert.Equal(t, []string{"/bin/sh", "-c"}, []string(cc.Config.Entrypoint))
			assert.Equal(t, []string{"HOME=/taskrun/home"}, cc.Config.Env)
			assert.Equal(t, "/taskrun/home", cc.Config.WorkingDir)
			assert.False(t, cc.Config.OpenStdin)
			assert.False(t, cc.Config.Tty)
		}},
		{"spec StopGrace rounds up to seconds", func(s *sandbox.Spec, _ *sandbox.Policy) { s.StopGrace = 1500 * time.Millisecond }, func(t *testing.T, cc createConfig) {
			require.NotNil(t, cc.Config.StopTimeout)
			assert.Equal(t, 2, *cc.Config.StopTimeout)
		}},
		{"labels", func(s *sandbox.Spec, _ *sandbox.Policy) {
			s.Labels = map[string]string{"team": "x", sandbox.LabelManaged: "false", sandbox.LabelRun: "spoofed"}
		}, func(t *testing.T, cc createConfig) {
			assert.Equal(t, map[string]string{
				"team":                    "x",
				sandbox.LabelManaged:      "true",
				sandbox.LabelTenant:       "tenant-1",
				sandbox.LabelConversation: "conv-1",
				sandbox.LabelTask:         "task-1",
				sandbox.LabelRun:          "run-1",
				sandbox.LabelCreated:      "2026-03-04T05:06:07Z",
				sandbox.LabelExpires:      "2026-03-04T06:11:17Z",
			}, cc.Config.Labels)
		}},
		{"labels without timeout have no expiry", func(s *sandbox.Spec, _ *sandbox.Policy) { s.Timeout = 0 }, func(t *testing.T, cc createConfig) {
			assert.NotContains(t, cc.Config.Labels, sandbox.LabelExpires)
			assert.Equal(t, "true", cc.Config.Labels[sandbox.LabelManaged])
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, pol := base()
			if tt.tweak != nil {
				tt.tweak(&spec, &pol)
			}
			tt.check(t, convert(spec, pol, created, slack))
		})
	}
}

func TestValidateSpec(t *testing.T) {
	ok := sandbox.Spec{Image: "img", Mounts: []sandbox.Mount{{Source: "/a", Target: "/b"}}}
	require.NoError(t, validateSpec(ok))
	require.ErrorContains(t, validateSpec(sandbox.Spec{}), "set Spec.Image")
	rel := ok
	rel.Mounts = []sandbox.Mount{{Source: "a", Target: "/b"}}
	require.ErrorContains(t, validateSpec(rel), "must be absolute")
}

func TestWrapCommandFollowsDockerEntrypointRules(t *testing.T) {
	wrapper := []string{"/w", "--"}
	cases := []struct {
		name            string
		entrypoint, cmd []string
		imgEP, imgCmd   []string
		wantCmd         []string
	}{
		{name: "image default", imgEP: []string{"/ep"}, imgCmd: []string{"a"}, wantCmd: []string{"/ep", "a"}},
		{name: "spec cmd keeps image entrypoint", cmd: []string{"b"}, imgEP: []string{"/ep"}, imgCmd: []string{"a"}, wantCmd: []string{"/ep", "b"}},
		{name: "spec entrypoint drops image cmd", entrypoint: []string{"/x"}, imgCmd: []string{"a"}, wantCmd: []string{"/x"}},
		{name: "image cmd only", imgCmd: []string{"/bin/sh"}, wantCmd: []string{"/bin/sh"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := sandbox.Spec{Image: "i", Entrypoint: tc.entrypoint, Cmd: tc.cmd, Wrapper: wrapper}
			got, err := wrapCommand(spec, tc.imgEP, tc.imgCmd)
			require.NoError(t, err)
			assert.Equal(t, wrapper, got.Entrypoint)
			assert.Equal(t, tc.wantCmd, got.Cmd)
			assert.Nil(t, got.Wrapper)
		})
	}
	_, err := wrapCommand(sandbox.Spec{Image: "i", Wrapper: wrapper}, nil, nil)
	require.Error(t, err, "an image with no command cannot be wrapped")
}
