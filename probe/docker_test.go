package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testImage = "taskrun/testbox:local"

var testLabel = fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())

// buildProbe compiles cmd/taskrun-probe statically into a temp dir.
func buildProbe(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "taskrun-probe")
	cmd := exec.Command("go", "build", "-o", out, "github.com/taskrun/taskrun/cmd/taskrun-probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	return out
}

type runResult struct {
	exit           int64
	stdout, stderr string
	report         *Report
	markerWritten  bool
}

// hardened is the executor's run configuration, shrunk for a test.
func hardened() *container.HostConfig {
	return &container.HostConfig{
		NetworkMode:    "none",
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		ReadonlyRootfs: true,
		Resources: container.Resources{
			Memory:     64 << 20,
			MemorySwap: 64 << 20,
			PidsLimit:  ptr(int64(256)),
		},
	}
}

func ptr[T any](v T) *T { return &v }

// runWrapped runs the agent stand-in (which writes /taskrun/marker) behind
// the probe with exp and returns what happened.
func runWrapped(t *testing.T, cli *client.Client, probeBin string, hc *container.HostConfig, exp Expectation) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runDir := t.TempDir()
	require.NoError(t, os.Chmod(runDir, 0o777))
	hc.Mounts = append(hc.Mounts,
		mount.Mount{Type: mount.TypeBind, Source: runDir, Target: "/taskrun"},
		mount.Mount{Type: mount.TypeBind, Source: probeBin, Target: "/.taskrun/bin/taskrun-probe", ReadOnly: true},
	)
	expJSON, err := json.Marshal(exp)
	require.NoError(t, err)
	nonce := fmt.Sprintf("n%d", time.Now().UnixNano())
	cfg := &container.Config{
		Image:      testImage,
		User:       "10001:10001",
		Entrypoint: []string{"/.taskrun/bin/taskrun-probe", "--nonce", nonce, "--expect", string(expJSON), "--"},
		Cmd:        []string{"sh", "-c", "echo ran > /taskrun/marker; echo agent-out; echo agent-err >&2"},
		Labels:     map[string]string{"dev.taskrun.managed": "true", "dev.taskrun.test.probe": testLabel},
	}
	resp, err := cli.ContainerCreate(ctx, cfg, hc, nil, nil, "")
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cli.ContainerRemove(context.Background(), resp.ID, container.RemoveOptions{Force: true})
	})
	require.NoError(t, cli.ContainerStart(ctx, resp.ID, container.StartOptions{}))
	var res runResult
	waitCh, errCh := cli.ContainerWait(ctx, resp.ID, container.WaitConditionNotRunning)
	select {
	case w := <-waitCh:
		res.exit = w.StatusCode
	case err := <-errCh:
		require.NoError(t, err)
	}
	logs, err := cli.ContainerLogs(ctx, resp.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	require.NoError(t, err)
	defer logs.Close()
	var stdout, stderr bytes.Buffer
	ic := NewInterceptor(&stderr, nonce)
	_, err = stdcopy.StdCopy(&stdout, ic, logs)
	require.NoError(t, err)
	require.NoError(t, ic.Flush())
	res.stdout, res.stderr = stdout.String(), stderr.String()
	res.report, _ = ic.Report()
	_, err = os.Stat(filepath.Join(runDir, "marker"))
	res.markerWritten = err == nil
	return res
}

func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

func fullExpectation(pids int64) Expectation {
	uid, mem := 10001, int64(64<<20)
	return Expectation{NonRoot: true, UID: &uid, CapEffZero: true, CapBndZero: true, NoNewPrivs: true, SeccompFilter: true,
		RootfsReadOnly: true, ProcSysReadOnly: true, NetworkNone: true, PidsMax: &pids, MemoryLimit: &mem, NoDockerSocket: true}
}

func TestProbeInHardenedContainer(t *testing.T) {
	cli := dockerClient(t)
	bin := buildProbe(t)

	res := runWrapped(t, cli, bin, hardened(), fullExpectation(256))
	require.Equal(t, int64(0), res.exit, "stderr: %s", res.stderr)
	require.NotNil(t, res.report, "the first stderr line is the report")
	r := res.report
	assert.Equal(t, 10001, r.UID)
	assert.Zero(t, r.CapEff)
	assert.Zero(t, r.CapBnd)
	assert.Equal(t, 1, r.NoNewPrivs)
	assert.Equal(t, 2, r.Seccomp)
	assert.True(t, r.RootfsReadOnly)
	assert.NotEmpty(t, r.RootfsWriteError)
	assert.True(t, r.ProcSysReadOnly)
	assert.Equal(t, int64(256), r.PidsMax)
	assert.Equal(t, int64(64<<20), r.MemoryLimit)
	assert.Empty(t, r.Interfaces)
	require.Len(t, r.Egress, 3)
	for _, e := range r.Egress {
		assert.False(t, e.Reachable, "%s %s", e.Name, e.Target)
	}
	assert.Empty(t, r.DockerSockets)
	assert.True(t, r.SocketSearchComplete, "errors: %v", r.Errors)
	_, ok := mountAt(r.Mounts, "/taskrun")
	assert.True(t, ok, "the run dir is visible in mountinfo")

	assert.True(t, res.markerWritten, "the agent ran after the probe")
	assert.Equal(t, "agent-out\n", res.stdout)
	assert.Equal(t, "agent-err\n", res.stderr, "the report line is removed, the agent's stderr passes through")
}

func TestProbeRefusesOnContradiction(t *testing.T) {
	cli := dockerClient(t)
	bin := buildProbe(t)

	cases := map[string]struct {
		hc     func() *container.HostConfig
		exp    Expectation
		reason string
	}{
		"claims network none on the default bridge": {
			hc:     func() *container.HostConfig { hc := hardened(); hc.NetworkMode = "bridge"; return hc },
			exp:    fullExpectation(256),
			reason: "expected loopback only",
		},
		"claims pids.max 256 with 512": {
			hc:     func() *container.HostConfig { hc := hardened(); hc.PidsLimit = ptr(int64(512)); return hc },
			exp:    fullExpectation(256),
			reason: "pids.max is 512, expected 256",
		},
		"claims no-new-privileges without it": {
			hc:     func() *container.HostConfig { hc := hardened(); hc.SecurityOpt = nil; return hc },
			exp:    fullExpectation(256),
			reason: "NoNewPrivs is 0, expected 1",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			res := runWrapped(t, cli, bin, tc.hc(), tc.exp)
			assert.Equal(t, int64(ExitContradiction), res.exit, "stderr: %s", res.stderr)
			assert.False(t, res.markerWritten, "the agent command must never run")
			assert.Empty(t, res.stdout)
			assert.Contains(t, res.stderr, tc.reason)
			assert.NotNil(t, res.report, "the report is written before refusing")
			assert.True(t, strings.Contains(res.stderr, "refusing to start the command"))
		})
	}
}
