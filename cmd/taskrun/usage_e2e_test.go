package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/sandbox"
)

// liveUsageLoad burns 2 s of CPU as its cgroup counts it, puts 48 MiB in
// /tmp (a tmpfs charged to the container's memory), writes 20 MiB to the
// run's home with direct I/O and holds 10 sleeping processes; then, past
// two samples, it prints its cgroup's figures (cgroup v1) and holds on.
const liveUsageLoad = `
c=/sys/fs/cgroup
while [ "$(cat $c/cpuacct/cpuacct.usage)" -lt 2000000000 ]; do
	i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done
done
head -c 50331648 /dev/zero > /tmp/fill
dd if=/dev/zero of="$HOME/disk" bs=1048576 count=20 oflag=direct conv=fsync 2>/dev/null
rm -f "$HOME/disk"
for i in 1 2 3 4 5 6 7 8 9 10; do sleep 300 & done
sleep 2.5
echo "cpu_ns $(cat $c/cpuacct/cpuacct.usage)"
echo "mem_peak $(cat $c/memory/memory.max_usage_in_bytes)"
echo "pids $(cat $c/pids/pids.current)"
awk '$2 == "Write" { w += $3 } END { print "io_write " w+0 }' $c/blkio/blkio.throttle.io_service_bytes
echo done
wait
`

// figuresOf parses the KEY N lines of out.
func figuresOf(t *testing.T, out string) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		require.NoError(t, err, "line %q", sc.Text())
		got[k] = n
	}
	return got
}

// A live run's usage is sampled from its cgroup while it lives: the
// daemon's figures, and then its record's, match what the cgroup itself
// counted within 10%.
func TestDaemonLiveRunUsageMatchesItsCgroup(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	runID := "usage" + strings.ToLower(tenant(t)[:8])
	_, stderr, code := d.runClient(t, 0, "--detach", "--user", e.user, "--run-id", runID, "--image", testImage)
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d.log)
	ctx := context.Background()
	c, err := daemon.Dial(ctx, d.sock)
	require.NoError(t, err)
	defer c.Close()

	// cgroup v1 on a 6.x kernel counts a device's block I/O only once it
	// has a throttle rule: one of 1 TiB/s limits nothing.
	id, err := exec.Command("docker", "ps", "-q", "--no-trunc", "--filter", "label="+sandbox.LabelRun+"="+runID).Output()
	require.NoError(t, err)
	cg := ""
	for _, p := range []string{"/sys/fs/cgroup/blkio/docker/", "/sys/fs/cgroup/blkio/system.slice/docker-"} {
		dir := p + string(bytes.TrimSpace(id))
		if strings.HasSuffix(p, "-") {
			dir += ".scope"
		}
		if _, err := os.Stat(dir); err == nil {
			cg = dir
		}
	}
	if cg == "" {
		t.Skip("the container's blkio cgroup (v1) is not on this host")
	}
	mounts, err := exec.Command("docker", "inspect", "-f", `{{range .Mounts}}{{.Destination}}={{.Source}} {{end}}`, string(bytes.TrimSpace(id))).Output()
	require.NoError(t, err)
	home := ""
	for _, m := range strings.Fields(string(mounts)) {
		if dst, src, _ := strings.Cut(m, "="); strings.HasPrefix(dst, "/taskrun") && home == "" {
			home = src
		}
	}
	var st unix.Stat_t
	require.NoError(t, unix.Stat(home, &st), "the run's home in %s", mounts)
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	for _, f := range []string{"blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"} {
		require.NoError(t, os.WriteFile(filepath.Join(cg, f), []byte(dev+" 1099511627776"), 0o644))
	}

	load, err := c.StartProcess(ctx, runID, daemon.ExecRequest{Argv: []string{"sh", "-c", liveUsageLoad}})
	require.NoError(t, err, d.log.String())
	var out lockedbuf.Buffer
	var off int64
	require.Eventually(t, func() bool {
		_, off, err = c.Output(ctx, runID, load.ID, off, false, &out, &out)
		return err == nil && strings.Contains(out.String(), "done\n")
	}, testdeadline.Scale(3*time.Minute), 100*time.Millisecond, "the load never finished: %s", &out)
	fig := figuresOf(t, strings.TrimSuffix(out.String(), "done\n"))
	t.Logf("cgroup: %v", fig)
	require.Greater(t, fig["cpu_ns"], 2e9)
	require.Greater(t, fig["mem_peak"], float64(48<<20))
	require.GreaterOrEqual(t, fig["io_write"], float64(20<<20))
	require.GreaterOrEqual(t, fig["pids"], 11.0)

	// Two more samples, with the load still held.
	first, err := c.Usage(ctx, runID)
	require.NoError(t, err)
	var live *sandbox.Usage
	require.Eventually(t, func() bool {
		live, err = c.Usage(ctx, runID)
		return err == nil && live.Samples >= first.Samples+2
	}, testdeadline.Scale(30*time.Second), 100*time.Millisecond)
	t.Logf("live: %+v", *live)
	within := func(what string, want, got float64) {
		t.Helper()
		assert.InEpsilon(t, want, got, 0.10, "%s: cgroup %v, taskrun %v", what, want, got)
	}
	within("live cpu seconds", fig["cpu_ns"]/1e9, live.CPUSeconds)
	within("live peak memory", fig["mem_peak"], float64(live.PeakMemoryBytes))
	within("live bytes written", fig["io_write"], float64(live.WriteBytes))
	within("live peak pids", fig["pids"], float64(live.PeakPids))

	// Another tenant reads none of it.
	assert.Equal(t, "404", asNobody(t, d.sock, "GET", "/v1/runs/"+runID+"/usage", ""))

	_, stderr, code = runTaskrun(t, d, "stop", runID)
	require.Equal(t, exitOK, code, stderr)
	rec := e.endedRecord(t, runID)
	require.NotNil(t, rec.Usage, "the record has the run's usage")
	t.Logf("record: %+v", *rec.Usage)
	within("recorded cpu seconds", fig["cpu_ns"]/1e9, rec.Usage.CPUSeconds)
	within("recorded peak memory", fig["mem_peak"], float64(rec.Usage.PeakMemoryBytes))
	within("recorded bytes written", fig["io_write"], float64(rec.Usage.WriteBytes))
	within("recorded peak pids", fig["pids"], float64(rec.Usage.PeakPids))
	e.requireNothingLeft(t, runID)
}
