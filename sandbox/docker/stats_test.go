package docker

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/sandbox"
)

// Stats of a live container are its cgroup's figures; once it exited,
// Stats says so with sandbox.ErrNotRunning.
func TestStatsReadsTheContainersCgroup(t *testing.T) {
	b, labels := newTestBackend(t)
	var out lockedbuf.Buffer
	policy := sandbox.DefaultPolicy()
	spec := sandbox.Spec{Image: testImage, Labels: labels, Timeout: time.Minute, StopGrace: time.Second,
		Cmd: []string{"sh", "-c", "head -c 33554432 /dev/zero > /tmp/fill; echo ready; exec sleep 60"}}
	h, err := b.Start(t.Context(), spec, policy, sandbox.Streams{Stdout: &out})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	require.True(t, b.Capabilities().Stats)
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "ready") }, time.Minute, 10*time.Millisecond)

	s, err := h.(sandbox.StatsReader).Stats(t.Context())
	require.NoError(t, err)
	t.Logf("stats: %+v", s)
	assert.Positive(t, s.CPU)
	assert.GreaterOrEqual(t, s.MemoryBytes, int64(32<<20), "the 32 MiB in the /tmp tmpfs are charged to the container")
	assert.GreaterOrEqual(t, s.PeakMemoryBytes, s.MemoryBytes)
	assert.Positive(t, s.Pids)
	if dir := memoryCgroupDir(h.ID()); dir != "" { // cgroup v1 on this host
		peak, err := readInt(filepath.Join(dir, "memory.max_usage_in_bytes"))
		require.NoError(t, err)
		assert.InEpsilon(t, float64(peak), float64(s.PeakMemoryBytes), 0.10, "the cgroup's own high-water mark")
		// The other controllers' directories are the memory one's siblings.
		sibling := func(controller, file string) int64 {
			n, err := readInt(filepath.Join(strings.Replace(dir, "/memory/", "/"+controller+"/", 1), file))
			require.NoError(t, err)
			return n
		}
		assert.InEpsilon(t, float64(sibling("cpuacct", "cpuacct.usage")), float64(s.CPU), 0.10, "the cgroup's own CPU time")
		assert.Equal(t, sibling("pids", "pids.current"), s.Pids, "the cgroup's own pids count")
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel() // stops the container
	res := h.Wait(ctx)
	require.True(t, res.Cancelled)
	_, err = h.(sandbox.StatsReader).Stats(t.Context())
	require.ErrorIs(t, err, sandbox.ErrNotRunning)
}

// The engine names block I/O operations "Read" and "Write" on cgroup v1
// and "read" and "write" on v2; both are counted, across devices.
func TestStatsOfCountsBothCgroupVersionsOps(t *testing.T) {
	var s container.StatsResponse
	s.CPUStats.CPUUsage.TotalUsage = 1_500_000_000
	s.MemoryStats.Usage, s.MemoryStats.MaxUsage = 10, 20
	s.PidsStats.Current = 7
	s.BlkioStats.IoServiceBytesRecursive = []container.BlkioStatEntry{
		{Major: 7, Minor: 1, Op: "Read", Value: 100}, {Major: 7, Minor: 1, Op: "Write", Value: 200}, {Major: 7, Minor: 1, Op: "Total", Value: 300},
		{Major: 254, Minor: 0, Op: "read", Value: 1}, {Major: 254, Minor: 0, Op: "write", Value: 2},
	}
	assert.Equal(t, sandbox.Stats{CPU: 1500 * time.Millisecond, MemoryBytes: 10, PeakMemoryBytes: 20, ReadBytes: 101, WriteBytes: 202, Pids: 7}, statsOf(s))
}
