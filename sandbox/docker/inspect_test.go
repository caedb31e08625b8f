package docker

import (
	"os"
	"strings"
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

// TestInspectLiveContainerPolicy reads a live container's `docker inspect`
// document and checks every policy field as the engine
// recorded it (what an auditor sees), not what was sent.
func TestInspectLiveContainerPolicy(t *testing.T) {
	for _, runtime := range []string{"", sandbox.RuntimeGVisor} {
		t.Run("runtime="+runtime, func(t *testing.T) {
			b, labels := newTestBackend(t)
			dir := t.TempDir()
			require.NoError(t, os.Chmod(dir, 0o777))
			pol := sandbox.DefaultPolicy()
			pol.Runtime = runtime
			spec := sandbox.Spec{
				Image: testImage, Cmd: []string{"sleep", "1000"}, Labels: labels,
				Run:     model.RunRef{UserID: "tenant-i", ConversationID: "conv-i", TaskID: "task-i", RunID: "run-i"},
				Mounts:  []sandbox.Mount{{Source: dir, Target: "/taskrun"}},
				Timeout: time.Minute, StopGrace: time.Second,
			}
			h, err := b.Start(t.Context(), spec, pol, sandbox.Streams{})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, h.Close(t.Context())) })

			info, _, err := b.api.ContainerInspectWithRaw(t.Context(), h.ID(), false)
			require.NoError(t, err)
			assertPolicyApplied(t, info, pol, spec, dir)

			// The contract's posture is the same document, read as facts.
			posture, err := h.Posture(t.Context())
			require.NoError(t, err)
			want, err := PostureFromInspect(info)
			require.NoError(t, err)
			assert.Equal(t, want, posture)
			assert.Equal(t, h.ID(), posture.ID)
			assert.Equal(t, []string{"ALL"}, posture.CapDrop)
			assert.Contains(t, posture.SecurityOpt, "no-new-privileges")
		})
	}
}

// assertPolicyApplied checks every policy field in an inspect document.
func assertPolicyApplied(t *testing.T, info container.InspectResponse, pol sandbox.Policy, spec sandbox.Spec, dir string) {
	t.Helper()
	require.NotNil(t, info.State)
	assert.True(t, info.State.Running)
	hc, cfg := info.HostConfig, info.Config
	require.NotNil(t, hc)
	require.NotNil(t, cfg)

	assert.Equal(t, pol.User, cfg.User)
	assert.Equal(t, []string{"ALL"}, []string(hc.CapDrop))
	assert.Empty(t, hc.CapAdd)
	assert.False(t, hc.Privileged)
	assert.Equal(t, []string{"no-new-privileges", seccomp.SecurityOpt()}, hc.SecurityOpt, "the engine keeps the profile byte for byte")
	for _, opt := range hc.SecurityOpt {
		assert.NotContains(t, opt, "unconfined")
	}
	assert.NotEqual(t, "unconfined", info.AppArmorProfile)
	assert.True(t, hc.ReadonlyRootfs)
	assert.Equal(t, map[string]string{"/tmp": tmpfsOptions(pol.TmpfsSizeBytes)}, hc.Tmpfs)
	require.NotNil(t, hc.PidsLimit)
	assert.Equal(t, pol.PidsLimit, *hc.PidsLimit)
	assert.Equal(t, pol.MemoryBytes, hc.Memory)
	assert.Equal(t, pol.MemoryBytes, hc.MemorySwap)
	assert.Equal(t, pol.NanoCPUs, hc.NanoCPUs)
	assert.Equal(t, container.NetworkMode(sandbox.NetworkNone), hc.NetworkMode)
	require.NotNil(t, hc.Init)
	assert.True(t, *hc.Init)
	assert.Equal(t, container.IPCModePrivate, hc.IpcMode)
	assert.Empty(t, string(hc.PidMode))
	assert.Empty(t, string(hc.UTSMode))
	assert.False(t, hc.PublishAllPorts)
	assert.Empty(t, hc.PortBindings)
	assert.Empty(t, hc.Devices)
	assert.Equal(t, container.RestartPolicyDisabled, hc.RestartPolicy.Name)
	assert.Equal(t, "json-file", hc.LogConfig.Type)
	assert.Equal(t, pol.LogMaxSize, hc.LogConfig.Config["max-size"])
	assert.Equal(t, "2", hc.LogConfig.Config["max-file"])
	assert.ElementsMatch(t, []*container.Ulimit{
		{Name: "nofile", Soft: pol.NoFile, Hard: pol.NoFile},
		{Name: "core", Soft: 0, Hard: 0},
	}, hc.Ulimits)
	wantRuntime := pol.Runtime
	if wantRuntime == "" {
		wantRuntime = "runc"
	}
	assert.Equal(t, wantRuntime, hc.Runtime)
	assert.Empty(t, hc.Binds)
	require.Len(t, hc.Mounts, 1)
	assert.Equal(t, mount.TypeBind, hc.Mounts[0].Type)
	assert.Equal(t, dir, hc.Mounts[0].Source)
	require.NotNil(t, hc.Mounts[0].BindOptions)
	assert.Equal(t, mount.PropagationRPrivate, hc.Mounts[0].BindOptions.Propagation)
	// The daemon keeps its default masked and read-only /proc paths.
	assert.NotEmpty(t, hc.MaskedPaths)
	assert.Contains(t, hc.ReadonlyPaths, "/proc/sys")

	assert.Equal(t, "true", cfg.Labels[sandbox.LabelManaged])
	assert.Equal(t, spec.Run.UserID, cfg.Labels[sandbox.LabelTenant])
	assert.Equal(t, spec.Run.TaskID, cfg.Labels[sandbox.LabelTask])
	assert.Equal(t, spec.Run.RunID, cfg.Labels[sandbox.LabelRun])
	created, ok := labelTime(cfg.Labels, sandbox.LabelCreated)
	require.True(t, ok)
	expires, ok := labelTime(cfg.Labels, sandbox.LabelExpires)
	require.True(t, ok)
	assert.Equal(t, spec.Timeout+spec.StopGrace+DefaultExpirySlack, expires.Sub(created))
	for k, v := range spec.Labels {
		assert.Equal(t, v, cfg.Labels[k])
	}
	assert.True(t, strings.HasPrefix(info.Image, "sha256:"))
}
