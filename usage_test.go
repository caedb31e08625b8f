package taskrun_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// usageAgent waits until the test made its cgroup count block I/O (see
// countBlockIO), then burns CPU until its cgroup counted 2 s, puts 64 MiB into /tmp (a
// tmpfs, charged to the container's memory), writes 20 MiB to its run
// directory (direct I/O, so the block I/O is the container's even when
// another process's sync flushes the page cache: cgroup v1 charges that
// writeback to the process that flushes) and holds 10
// sleeping processes. It then prints its cgroup's own figures (cgroup v1:
// the container's cgroup is mounted at /sys/fs/cgroup/<controller>) and
// stays a while before it exits, so the sampler reads the same state.
const usageAgent = `
set -e
n=0
while [ ! -e "$HOME/go" ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done
c=/sys/fs/cgroup
while [ "$(cat $c/cpuacct/cpuacct.usage)" -lt 2000000000 ]; do
	i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done
done
head -c 67108864 /dev/zero > /tmp/fill
dd if=/dev/zero of="$HOME/disk" bs=1048576 count=20 oflag=direct conv=fsync 2>/dev/null
rm -f "$HOME/disk" "$HOME/go"
for i in 1 2 3 4 5 6 7 8 9 10; do sleep 6 & done
sleep 1.5
echo "cpu_ns $(cat $c/cpuacct/cpuacct.usage)"
echo "mem_peak $(cat $c/memory/memory.max_usage_in_bytes)"
echo "pids $(cat $c/pids/pids.current)"
awk '$2 == "Read" { r += $3 } $2 == "Write" { w += $3 } END { print "io_read " r+0; print "io_write " w+0 }' $c/blkio/blkio.throttle.io_service_bytes
sleep 2.5
kill $(jobs -p) 2>/dev/null || true
`

// blkioCgroup is the v1 blkio cgroup of the running container id, for the
// cgroupfs and the systemd cgroup drivers; "" while there is none.
func blkioCgroup(id string) string {
	for _, cg := range []string{"/sys/fs/cgroup/blkio/docker/" + id, "/sys/fs/cgroup/blkio/system.slice/docker-" + id + ".scope"} {
		if _, err := os.Stat(cg); err == nil {
			return cg
		}
	}
	return ""
}

// countBlockIO makes the blkio cgroup cg count the I/O of the filesystem
// holding dir. On cgroup v1 with a recent kernel (6.x), a block device's
// blkio.throttle counters stay 0 until a throttle rule exists for it; a
// rule of 1 TiB/s limits nothing and turns them on.
func countBlockIO(t *testing.T, cg, dir string) {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Stat(dir, &st))
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	for _, f := range []string{"blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"} {
		require.NoError(t, os.WriteFile(filepath.Join(cg, f), []byte(dev+" 1099511627776"), 0o644))
	}
}

// cgroupFigures parses what usageAgent printed.
func cgroupFigures(t *testing.T, out string) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		require.NoError(t, err, "line %q", sc.Text())
		got[k] = n
	}
	for _, k := range []string{"cpu_ns", "mem_peak", "pids", "io_read", "io_write"} {
		require.Contains(t, got, k, "the agent printed no %s: %s", k, out)
	}
	return got
}

// The run's recorded usage, sampled through the Docker stats API, matches
// the container's cgroup figures, as the agent itself read them just
// before it exited, within 10%.
func TestUsageMatchesTheContainersCgroup(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "usage1", "sh", "-c", usageAgent)
	in.Policy = sandbox.DefaultPolicy()
	in.Policy.TmpfsSizeBytes = 128 << 20
	type result struct {
		out *taskrun.Outcome
		err error
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() {
		out, err := taskrun.Execute(ctx, in)
		done <- result{out, err}
	}()
	// A failure below ends the run before the harness cleans up.
	t.Cleanup(func() {
		cancel()
		select {
		case r := <-done:
			done <- r
		case <-time.After(time.Minute):
		}
	})
	var cg string
	require.Eventually(t, func() bool {
		ids, _ := h.Containers(ctx, "usage1")
		if len(ids) == 1 {
			cg = blkioCgroup(ids[0])
		}
		return cg != ""
	}, time.Minute, 20*time.Millisecond, "the run's container never started (or its blkio cgroup is not on this host)")
	runDir := h.RunDir("usage1")
	countBlockIO(t, cg, runDir)
	require.NoError(t, os.WriteFile(filepath.Join(runDir, "home", "go"), nil, 0o644))
	res := <-done
	done <- res
	out, err := res.out, res.err
	require.NoError(t, err, "stdout: %s", out.Result.OutputStr)
	require.Equal(t, model.StatusSucceeded, out.Status)
	fig := cgroupFigures(t, out.Result.OutputStr)
	require.NotNil(t, out.Usage, "the Docker backend samples usage")
	u := *out.Usage
	t.Logf("cgroup: %v", fig)
	t.Logf("record: %+v", u)

	// The workload is what the cgroup counted: the comparison below is
	// not one of zeros.
	require.Greater(t, fig["cpu_ns"], int64(2_000_000_000))
	require.Greater(t, fig["mem_peak"], int64(64<<20))
	require.GreaterOrEqual(t, fig["io_write"], int64(20<<20))
	require.GreaterOrEqual(t, fig["pids"], int64(11))

	within := func(what string, want, got float64) {
		t.Helper()
		assert.InEpsilon(t, want, got, 0.10, "%s: cgroup %v, record %v", what, want, got)
	}
	within("cpu seconds", float64(fig["cpu_ns"])/1e9, u.CPUSeconds)
	within("peak memory", float64(fig["mem_peak"]), float64(u.PeakMemoryBytes))
	within("bytes written", float64(fig["io_write"]), float64(u.WriteBytes))
	within("peak pids", float64(fig["pids"]), float64(u.PeakPids))
	assert.InDelta(t, float64(fig["io_read"]), float64(u.ReadBytes), max(0.1*float64(fig["io_read"]), 1<<20), "bytes read")
	assert.GreaterOrEqual(t, u.Samples, 4, "sampled every second over the run")

	idx, err := runindex.Find(context.Background(), h.Store, "usage1", h.Tenant)
	require.NoError(t, err)
	require.NotNil(t, idx.Usage)
	assert.Equal(t, u, *idx.Usage, "the index record holds the same figures")
}
