package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"
	"github.com/docker/go-connections/nat"
	units "github.com/docker/go-units"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	mobyseccomp "github.com/moby/profiles/seccomp"

	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/sandbox/seccomp"
)

const testImage = "taskrun/testbox:local"

// testLabel is unique to this test process so cleanup only touches our own.
var testLabel = fmt.Sprintf("dev.taskrun.test.audit=%d-%d", os.Getpid(), time.Now().UnixNano())

func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), testdeadline.Scale(10*time.Second))
	defer cancel()
	_, err = cli.ImageInspect(ctx, testImage)
	require.NoError(t, err, "image %s must exist locally (never pulled)", testImage)
	t.Cleanup(func() { cli.Close() })
	return cli
}

// backend connects to the engine the way `taskrun audit` does.
func backend(t *testing.T) *docker.Backend {
	t.Helper()
	b, err := docker.New(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

// containers audits the given containers against the engine's host facts,
// as `taskrun audit` does.
func containers(ctx context.Context, t *testing.T, ids ...string) ([]Report, error) {
	b := backend(t)
	host, err := b.HostFacts(ctx)
	if err != nil {
		return nil, err
	}
	postures, err := b.Postures(ctx, ids...)
	if err != nil {
		return nil, err
	}
	reports := make([]Report, len(postures))
	for i, p := range postures {
		reports[i] = Check(p, host, Options{})
	}
	return reports, nil
}

type fixture struct {
	cfg *container.Config
	hc  *container.HostConfig
}

// baseline builds a container configuration that passes every applicable
// rule, the way the executor configures a run.
func baseline(t *testing.T, runID string) fixture {
	runDir := filepath.Join(t.TempDir(), "runs", runID)
	require.NoError(t, os.MkdirAll(runDir, 0o755))
	helper := filepath.Join(t.TempDir(), "taskrun-probe")
	require.NoError(t, os.WriteFile(helper, []byte("#!/bin/sh\n"), 0o755))
	key, val, _ := strings.Cut(testLabel, "=")
	return fixture{
		cfg: &container.Config{
			Image:      testImage,
			Cmd:        []string{"true"},
			User:       "10001:10001",
			WorkingDir: "/taskrun",
			Labels:     map[string]string{sandbox.LabelManaged: "true", sandbox.LabelRun: runID, key: val},
		},
		hc: &container.HostConfig{
			NetworkMode:    "none",
			CapDrop:        []string{"ALL"},
			SecurityOpt:    []string{"no-new-privileges", seccomp.SecurityOpt()},
			ReadonlyRootfs: true,
			IpcMode:        "private",
			RestartPolicy:  container.RestartPolicy{Name: container.RestartPolicyDisabled},
			LogConfig:      container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "1m", "max-file": "2"}},
			Tmpfs:          map[string]string{"/tmp": "rw,nosuid,nodev,size=16m"},
			Mounts: []mount.Mount{
				{Type: mount.TypeBind, Source: runDir, Target: RunDirTarget},
				{Type: mount.TypeBind, Source: helper, Target: HelperTarget + "/taskrun-probe", ReadOnly: true},
			},
			Resources: container.Resources{
				Memory:     64 << 20,
				MemorySwap: 64 << 20,
				NanoCPUs:   500_000_000,
				PidsLimit:  ptr(int64(64)),
				Ulimits: []*units.Ulimit{
					{Name: "nofile", Soft: 1024, Hard: 1024},
					{Name: "core", Soft: 0, Hard: 0},
				},
			},
		},
	}
}

func create(t *testing.T, cli *client.Client, f fixture) string {
	t.Helper()
	ctx := context.Background()
	resp, err := cli.ContainerCreate(ctx, f.cfg, f.hc, nil, nil, "")
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cli.ContainerRemove(context.Background(), resp.ID, container.RemoveOptions{Force: true})
	})
	return resp.ID
}

func TestDockerFixturesFlagExactlyTheirRule(t *testing.T) {
	cli := dockerClient(t)
	ctx := context.Background()

	cases := []struct {
		name   string
		break_ func(f *fixture)
		want   []string
	}{
		{"baseline", func(*fixture) {}, nil},
		// Privileged also makes the daemon drop MaskedPaths/ReadonlyPaths,
		// which TR:proc-masking reports on its own.
		{"privileged", func(f *fixture) { f.hc.Privileged = true }, []string{"5.5", "TR:proc-masking"}},
		{"cap-add SYS_ADMIN", func(f *fixture) { f.hc.CapAdd = []string{"SYS_ADMIN"} }, []string{"5.4"}},
		{"no no-new-privileges", func(f *fixture) { f.hc.SecurityOpt = f.hc.SecurityOpt[1:] }, []string{"5.26"}},
		// Unconfined is no profile at all, and so not taskrun's either.
		{"seccomp unconfined", func(f *fixture) { f.hc.SecurityOpt[1] = "seccomp=unconfined" }, []string{"5.22", "TR:seccomp-profile"}},
		{"daemon default seccomp profile", func(f *fixture) { f.hc.SecurityOpt = f.hc.SecurityOpt[:1] }, []string{"TR:seccomp-profile"}},
		{"Docker's default seccomp profile inline", func(f *fixture) {
			profile, err := json.Marshal(mobyseccomp.DefaultProfile())
			require.NoError(t, err)
			f.hc.SecurityOpt[1] = "seccomp=" + string(profile)
		}, []string{"TR:seccomp-profile"}},
		{"writable rootfs", func(f *fixture) { f.hc.ReadonlyRootfs = false }, []string{"5.13"}},
		{"memory 0", func(f *fixture) { f.hc.Memory, f.hc.MemorySwap = 0, 0 }, []string{"5.11"}},
		{"swap unlimited", func(f *fixture) { f.hc.MemorySwap = -1 }, []string{"TR:no-swap"}},
		{"nano cpus 0", func(f *fixture) { f.hc.NanoCPUs = 0 }, []string{"5.12"}},
		{"pids unlimited", func(f *fixture) { f.hc.PidsLimit = ptr(int64(-1)) }, []string{"5.29"}},
		{"network host", func(f *fixture) { f.hc.NetworkMode = "host" }, []string{"5.10"}},
		{"pid host", func(f *fixture) { f.hc.PidMode = "host" }, []string{"5.16"}},
		{"ipc host", func(f *fixture) { f.hc.IpcMode = "host" }, []string{"5.17"}},
		{"uts host", func(f *fixture) { f.hc.UTSMode = "host" }, []string{"5.21"}},
		{"docker.sock", func(f *fixture) {
			f.hc.Mounts = append(f.hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: "/var/run/docker.sock", Target: "/var/run/docker.sock"})
		}, []string{"5.32"}},
		{"bind /etc", func(f *fixture) {
			f.hc.Mounts = append(f.hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: "/etc", Target: "/host-etc", ReadOnly: true})
		}, []string{"5.6"}},
		{"propagation shared", func(f *fixture) {
			f.hc.Mounts[0].BindOptions = &mount.BindOptions{Propagation: mount.PropagationShared}
		}, []string{"5.20"}},
		{"other host dir", func(f *fixture) {
			f.hc.Mounts = append(f.hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: t.TempDir(), Target: "/other"})
		}, []string{"TR:only-run-mount"}},
		{"device /dev/null", func(f *fixture) {
			f.hc.Devices = []container.DeviceMapping{{PathOnHost: "/dev/null", PathInContainer: "/dev/xnull", CgroupPermissions: "rwm"}}
		}, []string{"5.18"}},
		{"port binding", func(f *fixture) {
			f.cfg.ExposedPorts = nat.PortSet{"80/tcp": {}}
			f.hc.PortBindings = nat.PortMap{"80/tcp": {{HostPort: "18080"}}}
		}, []string{"5.8"}},
		{"restart always", func(f *fixture) { f.hc.RestartPolicy = container.RestartPolicy{Name: container.RestartPolicyAlways} }, []string{"5.15"}},
		{"cgroup parent", func(f *fixture) { f.hc.CgroupParent = "/taskrun-audit-test" }, []string{"5.25"}},
		{"user root", func(f *fixture) { f.cfg.User = "0:0" }, []string{"PSS:runAsNonRoot"}},
		// This daemon fills max-size from daemon.json when it is absent, so
		// the uncapped fixture sets a non-positive size instead.
		{"json-file uncapped", func(f *fixture) { f.hc.LogConfig.Config = map[string]string{"max-size": "-1"} }, []string{"TR:log-capped"}},
		{"workdir /proc/self", func(f *fixture) { f.cfg.WorkingDir = "/proc/self" }, []string{"TR:workdir-not-proc"}},
		{"no ulimits", func(f *fixture) { f.hc.Ulimits = nil }, []string{"5.19"}},
		{"executor tmpfs options", func(f *fixture) { f.hc.Tmpfs["/tmp"] = "rw,exec,nosuid,nodev,size=16777216" }, nil},
		{"tmpfs without size", func(f *fixture) { f.hc.Tmpfs["/tmp"] = "rw,nosuid,nodev" }, []string{"TR:tmpfs"}},
		{"tmpfs through Mounts", func(f *fixture) {
			f.hc.Mounts = append(f.hc.Mounts, mount.Mount{Type: mount.TypeTmpfs, Target: "/scratch", TmpfsOptions: &mount.TmpfsOptions{SizeBytes: 1 << 20}})
		}, []string{"TR:tmpfs"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := baseline(t, "run-audit-1")
			tc.break_(&f)
			id := create(t, cli, f)
			reports, err := containers(ctx, t, id)
			require.NoError(t, err)
			require.Len(t, reports, 1)
			assert.Equal(t, tc.want, reports[0].FailedIDs(), "%+v", reports[0].Findings)
			assert.Equal(t, tc.want != nil, reports[0].Failed())
		})
	}
}

func TestDockerStartedBaselinePasses(t *testing.T) {
	cli := dockerClient(t)
	ctx := context.Background()
	id := create(t, cli, baseline(t, "run-audit-2"))
	require.NoError(t, cli.ContainerStart(ctx, id, container.StartOptions{}))
	waitCh, errCh := cli.ContainerWait(ctx, id, container.WaitConditionNotRunning)
	select {
	case w := <-waitCh:
		assert.Equal(t, int64(0), w.StatusCode)
	case err := <-errCh:
		require.NoError(t, err)
	}
	reports, err := containers(ctx, t, id)
	require.NoError(t, err)
	assert.Empty(t, reports[0].FailedIDs())

	ids, err := backend(t).ManagedIDs(ctx, testLabel)
	require.NoError(t, err)
	assert.Contains(t, ids, id)
}

func TestDockerAppArmorNotApplicableHere(t *testing.T) {
	cli := dockerClient(t)
	host, err := backend(t).HostFacts(context.Background())
	require.NoError(t, err)
	if host.AppArmor {
		t.Skip("this host has AppArmor; the NOT_APPLICABLE path is covered by TestAppArmorNotApplicableWithoutHostSupport")
	}
	id := create(t, cli, baseline(t, "run-audit-3"))
	reports, err := containers(context.Background(), t, id)
	require.NoError(t, err)
	assert.Equal(t, NotApplicable, findingByID(t, reports[0], "5.2").Status)
}
