package abuse_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
)

// Host cgroup v1 directories of Docker's containers (cgroupfs driver).
const (
	pidsCgroupRoot   = "/sys/fs/cgroup/pids/docker"
	memoryCgroupRoot = "/sys/fs/cgroup/memory/docker"
)

// scaledSeconds is d scaled to the machine's slowdown, in whole seconds.
func scaledSeconds(d time.Duration) time.Duration {
	return testdeadline.Scale(d).Round(time.Second)
}

// readCgroupInt reads one integer cgroup file of a container.
func readCgroupInt(root, id, file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(root, id, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// pidsLimitHits is the "max" counter of pids.events: how many forks the
// pids limit refused.
func pidsLimitHits(id string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(pidsCgroupRoot, id, "pids.events"))
	if err != nil {
		return 0, err
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "max ")
	if !ok {
		return 0, fmt.Errorf("pids.events %q has no max counter", b)
	}
	return strconv.ParseInt(v, 10, 64)
}

// A shell fork bomb never gets more processes than the pids limit, the host
// can still fork while the bomb is at the limit, and the run ends at its
// timeout as FAILED.
//
// Protection: the container's pids cgroup limit (Policy.PidsLimit, default
// 256) and the run timeout. Without the limit pids.current passes 256 and
// pids.events never counts a refused fork; without the timeout the run does
// not end.
func TestForkBombStaysUnderPidsLimit(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	h := newHarness(t)
	// exec keeps the container's main process alive without needing a fork.
	in, rec := h.input(t, "forkbomb", `b() { b | b & }; b; exec sleep 600`)
	// The bomb must reach the limit, and the test see it there, before the
	// timeout ends the run: 8s on an idle machine, scaled.
	in.Timeout = scaledSeconds(8 * time.Second)
	limit := in.Policy.PidsLimit
	require.EqualValues(t, sandbox.DefaultPidsLimit, limit)

	var peak, hits int64
	var cgroupMax string
	hostForks := 0
	var hostForkErrs []error
	o := h.watch(t, in, 100*time.Millisecond, func(id string) {
		cur, err := readCgroupInt(pidsCgroupRoot, id, "pids.current")
		if err != nil {
			return // the container is gone
		}
		peak = max(peak, cur)
		if b, err := os.ReadFile(filepath.Join(pidsCgroupRoot, id, "pids.max")); err == nil {
			cgroupMax = strings.TrimSpace(string(b))
		}
		if n, err := pidsLimitHits(id); err == nil {
			hits = max(hits, n)
		}
		if hits > 0 {
			// The bomb is pressing against the limit: the host must still fork.
			hostForks++
			if err := exec.Command("/bin/true").Run(); err != nil {
				hostForkErrs = append(hostForkErrs, err)
			}
		}
	})
	t.Logf("pids.current peak %d of %d; %d forks refused; %d host forks", peak, limit, hits, hostForks)
	assert.Equal(t, strconv.FormatInt(limit, 10), cgroupMax, "the host cgroup carries the policy's limit")
	assert.Positive(t, hits, "the bomb pressed against the pids limit")
	assert.LessOrEqual(t, peak, limit, "pids.current exceeded the limit")
	assert.Positive(t, hostForks, "the host forked while the bomb was at the limit")
	assert.Empty(t, hostForkErrs, "the host could not fork")

	require.ErrorIs(t, o.err, taskrun.ErrRunFailed)
	assert.True(t, o.out.Exit.TimedOut)
	assert.Equal(t, model.StatusFailed, o.out.Status)
	assert.Equal(t, "timed out after "+in.Timeout.String(), o.out.Reason)
	assert.Equal(t, model.StatusFailed, last(t, rec).Status)
	h.assertNoContainers(t)
}

// A memory bomb over a 64 MiB limit is killed by the kernel inside the
// container, whose memory never exceeds the limit, and the run FAILS with an
// out-of-memory reason.
//
// Protection: the memory cgroup limit (Policy.MemoryBytes, swap capped to
// the same value). Without it tail buffers the 512 MiB and exits 0, and the
// run succeeds.
//
// The container's peak is its cgroup's high-water mark, read once, when the
// engine reports the OOM kill; the run then waits for the test to have read
// it (a file the test writes in its home), so a slow machine cannot end the
// container, and remove its cgroup, first.
func TestMemoryBombIsOOMKilled(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	h := newHarness(t)
	// tail keeps the last 600 MB of its input in memory.
	in, rec := h.input(t, "membomb", `head -c 512m /dev/zero | tail -c 600000000; echo "tail exited $?"; `+
		`while [ ! -e "$HOME/sampled" ]; do sleep 0.05; done`)
	in.Policy.MemoryBytes = 64 << 20
	// The kill is the kernel's, and it comes only once reclaim in the
	// cgroup gives up: at load 15 with stress-ng beside the suite the pipe
	// has stalled for over 2 minutes before it (2 to 14 s by hand at the
	// same load, 5 s idle). The test waits on the engine's OOM event; this
	// deadline only bounds a kill that is not coming, so it scales.
	in.Timeout = scaledSeconds(runTimeout)
	sampled := filepath.Join(h.RunDir("membomb"), "home", "sampled")
	release := func() { _ = os.WriteFile(sampled, nil, 0o644) }
	t.Cleanup(release) // a failing test does not leave the run waiting out its timeout

	// Since: the engine replays what happened between this call and the
	// subscription, so the OOM cannot slip between them.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, errs := h.cli.Events(ctx, events.ListOptions{Since: strconv.FormatInt(time.Now().Unix()-1, 10), Filters: filters.NewArgs(
		filters.Arg("type", string(events.ContainerEventType)),
		filters.Arg("event", string(events.ActionOOM)),
		filters.Arg("label", sandbox.LabelTenant+"="+h.Tenant),
		filters.Arg("label", sandbox.LabelRun+"=membomb"),
	)})
	done := make(chan outcome, 1)
	go func() {
		out, err := taskrun.Execute(context.Background(), in)
		done <- outcome{out, err}
	}()
	var peak int64
	var o outcome
	select {
	case m := <-msgs:
		v, err := readCgroupInt(memoryCgroupRoot, m.Actor.ID, "memory.max_usage_in_bytes")
		require.NoError(t, err, "the container's cgroup, after the OOM kill")
		peak = v
		release()
		o = <-done
	case err := <-errs:
		t.Fatalf("following the engine's events: %v", err)
	case o = <-done:
		t.Fatalf("the run ended without an OOM kill (error: %v)", o.err)
	}
	t.Logf("container memory peak %d MiB, limit %d MiB", peak>>20, in.Policy.MemoryBytes>>20)
	assert.Positive(t, peak, "the container's memory was read")
	assert.LessOrEqual(t, peak, in.Policy.MemoryBytes)

	require.ErrorIs(t, o.err, taskrun.ErrRunFailed)
	assert.True(t, o.out.Exit.OOMKilled, "the engine saw the OOM kill")
	assert.Equal(t, model.StatusFailed, o.out.Status)
	assert.Equal(t, "out of memory: the container exceeded its 64 MiB limit", o.out.Reason)
	assert.Contains(t, o.out.Result.OutputStr, "tail exited 137", "the kernel killed the bomb with SIGKILL")
	final := last(t, rec)
	assert.Equal(t, model.StatusFailed, final.Status)
	require.NotNil(t, final.Error)
	assert.Equal(t, o.out.Reason, *final.Error)
	assert.Equal(t, "tail exited 137\n", h.runFile(t, "membomb", taskrun.OutputLogName))
}

// ddRecordsOut is how many full blocks dd reported writing.
var ddRecordsOut = regexp.MustCompile(`(?m)^(\d+)\+\d+ records out$`)

// ddWrittenMiB parses dd's report (bs=1M) from out.
func ddWrittenMiB(t *testing.T, out string) int {
	t.Helper()
	m := ddRecordsOut.FindStringSubmatch(out)
	require.NotNil(t, m, "no dd report in %q", out)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}

// Filling /tmp stops at its size with ENOSPC inside the sandbox; the run
// itself goes on and succeeds.
//
// Protection: /tmp is a tmpfs capped at Policy.TmpfsSizeBytes (default
// 64 MiB), charged to the container's memory, so nothing lands on the host
// disk. Without the size the 256 MiB write completes.
func TestFillingTmpHitsItsCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	in, _ := h.input(t, "filltmp", `dd if=/dev/zero of=/tmp/fill bs=1M count=256 2>&1; echo "dd exited $?"`)

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, out.Status)
	assert.Contains(t, out.Result.OutputStr, "No space left on device")
	assert.Contains(t, out.Result.OutputStr, "dd exited 1")
	capMiB := int(in.Policy.TmpfsSizeBytes >> 20)
	assert.LessOrEqual(t, ddWrittenMiB(t, out.Result.OutputStr), capMiB, "dd wrote more than the %d MiB /tmp", capMiB)
}

// Filling /taskrun stops at the run's disk cap: with root and loop devices
// the write fails with ENOSPC inside the sandbox and the run goes on;
// elsewhere the watchdog stops the run and it FAILS with ErrDiskLimit.
//
// Protection: RunTaskInput.DiskLimitBytes (a loop-mounted filesystem of that
// size, or the watchdog). Without it the 256 MiB write lands on the host.
func TestFillingRunDirHitsDiskCap(t *testing.T) {
	t.Parallel()
	onPaths(t, func(t *testing.T, h *harness) {
		in, rec := h.input(t, "filldisk", `dd if=/dev/zero of=/taskrun/home/fill bs=1M count=256 2>&1; echo "dd exited $?"; sleep 3`)
		in.DiskLimitBytes = 32 << 20

		out, err := h.execute(in)
		if errors.Is(err, taskrun.ErrDiskLimit) {
			assert.Equal(t, model.StatusFailed, out.Status, "the watchdog stopped the run")
			assert.Equal(t, model.StatusFailed, last(t, rec).Status)
			return
		}
		require.NoError(t, err)
		assert.Equal(t, model.StatusSucceeded, out.Status)
		assert.Contains(t, out.Result.OutputStr, "No space left on device")
		assert.Contains(t, out.Result.OutputStr, "dd exited 1")
		assert.Less(t, ddWrittenMiB(t, out.Result.OutputStr), 32, "dd wrote past the 32 MiB cap")
		assert.Equal(t, out.Result.OutputStr, h.runFile(t, "filldisk", taskrun.OutputLogName))
	})
}

// A process that ignores SIGTERM is killed at the timeout after the grace
// period: it sees the SIGTERM, keeps running through the grace, dies by
// SIGKILL (exit 137, not 143), the run FAILS as timed out and its container
// is gone.
//
// Protection: the stop escalation of the timeout (SIGTERM, then SIGKILL after
// StopGrace). Without the SIGKILL the run never ends.
func TestSIGTERMIgnoredIsKilledAfterGrace(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	in, rec := h.input(t, "noterm", `trap 'echo caught TERM, ignoring' TERM
echo armed
while :; do echo tick; sleep 1; done`)
	// The shell must have set its trap and ticked before the timeout sends
	// SIGTERM: 3s on an idle machine, scaled.
	in.Timeout = scaledSeconds(3 * time.Second)

	out, err := taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, taskrun.ErrRunFailed)
	assert.True(t, out.Exit.TimedOut)
	assert.Equal(t, 128+9, out.Exit.ExitCode, "SIGKILL ended the container")
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.Equal(t, "timed out after "+in.Timeout.String(), out.Reason)
	assert.Equal(t, model.StatusFailed, last(t, rec).Status)

	log := h.runFile(t, "noterm", taskrun.OutputLogName)
	require.True(t, strings.HasPrefix(log, "armed\ntick\n"), "output: %q", log)
	_, afterTerm, ok := strings.Cut(log, "caught TERM, ignoring\n")
	require.True(t, ok, "the process received SIGTERM; output: %q", log)
	assert.Contains(t, afterTerm, "tick", "the process ran on through the grace period")
	h.assertNoContainers(t)
}
