package docker

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
)

// cliRunArgs is `docker run --rm` with the same policy, labels and bind mount
// as the backend applies.
func cliRunArgs(pol sandbox.Policy, labels map[string]string, dir string) []string {
	args := []string{"run", "--rm",
		"--label", sandbox.LabelManaged + "=true",
		"--user", pol.User,
		"--cap-drop", "ALL",
		"--security-opt", "no-new-privileges",
		"--read-only",
		"--tmpfs", TmpfsPath + ":" + tmpfsOptions(pol.TmpfsSizeBytes),
		"--pids-limit", fmt.Sprint(pol.PidsLimit),
		"--memory", fmt.Sprint(pol.MemoryBytes),
		"--memory-swap", fmt.Sprint(pol.MemoryBytes),
		"--cpus", fmt.Sprintf("%.3f", float64(pol.NanoCPUs)/1e9),
		"--network", pol.NetworkMode,
		"--init",
		"--ipc", "private",
		"--restart", "no",
		"--log-driver", "json-file",
		"--log-opt", "max-size=" + pol.LogMaxSize,
		"--log-opt", fmt.Sprintf("max-file=%d", pol.LogMaxFile),
		"--ulimit", fmt.Sprintf("nofile=%d:%d", pol.NoFile, pol.NoFile),
		"--ulimit", "core=0:0",
		"--mount", "type=bind,source=" + dir + ",target=/taskrun,bind-propagation=rprivate",
	}
	for k, v := range labels {
		args = append(args, "--label", k+"="+v)
	}
	return append(args, testImage, "true")
}

// BenchmarkColdRun alternates `docker run --rm` and the backend on the same
// image, command (`true`), policy and bind mount, and reports both costs per
// run and their ratio (backend / CLI).
func BenchmarkColdRun(b *testing.B) {
	backend, err := New(b.Context())
	require.NoError(b, err)
	defer backend.Close()
	labels := map[string]string{labelTest: "bench-" + fmt.Sprint(time.Now().UnixNano())}
	defer func() {
		ids, _ := backend.listLabelled(b.Context(), labels)
		for _, id := range ids {
			_ = backend.removeContainer(b.Context(), id)
		}
	}()
	dir := b.TempDir()
	require.NoError(b, os.Chmod(dir, 0o777))
	pol := sandbox.DefaultPolicy()
	spec := sandbox.Spec{Image: testImage, Cmd: []string{"true"}, Labels: labels,
		Mounts: []sandbox.Mount{{Source: dir, Target: "/taskrun"}}}
	cliArgs := cliRunArgs(pol, labels, dir)

	var cliTotal, backendTotal time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		out, err := exec.CommandContext(b.Context(), "docker", cliArgs...).CombinedOutput()
		require.NoError(b, err, string(out))
		cliTotal += time.Since(start)

		start = time.Now()
		h, err := backend.Start(b.Context(), spec, pol, sandbox.Streams{})
		require.NoError(b, err)
		res := h.Wait(b.Context())
		require.NoError(b, h.Close(b.Context()))
		backendTotal += time.Since(start)
		require.NoError(b, res.Err)
		require.Equal(b, 0, res.ExitCode)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(cliTotal)/float64(time.Millisecond)/n, "cli-ms/op")
	b.ReportMetric(float64(backendTotal)/float64(time.Millisecond)/n, "backend-ms/op")
	b.ReportMetric(float64(backendTotal)/float64(cliTotal), "backend/cli")
}
