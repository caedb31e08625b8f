package main

import (
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// The worker end to end: `taskrun worker` processes built from this package,
// real containers, and a control plane over HTTP on loopback.

const workerToken = "e2e-worker-token"

// workerProc is one `taskrun worker` process.
type workerProc struct {
	cmd     *exec.Cmd
	root    string
	metrics string
	log     *os.File
	exited  chan struct{}
	err     error
}

// workerFleet starts and tracks worker processes against one control plane.
type workerFleet struct {
	t         *testing.T
	env       *crashEnv
	server    string
	tokenFile string
	mu        sync.Mutex
	procs     []*workerProc
}

func newWorkerFleet(t *testing.T, env *crashEnv, server string) *workerFleet {
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(workerToken+"\n"), 0o600))
	f := &workerFleet{t: t, env: env, server: server, tokenFile: tokenFile}
	t.Cleanup(func() {
		for _, p := range f.procs {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
				<-p.exited
			}
			if t.Failed() {
				data, _ := os.ReadFile(p.log.Name())
				t.Logf("worker log %s:\n%s", p.root, tail(string(data), 4000))
			}
			p.log.Close()
		}
	})
	return f
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// start starts a worker on root (a fresh one when "").
func (f *workerFleet) start(root string, slots int) *workerProc {
	return f.startOn(f.server, root, slots)
}

// startOn starts a worker leasing from server, with extra flags.
func (f *workerFleet) startOn(server, root string, slots int, extra ...string) *workerProc {
	t := f.t
	if root == "" {
		root = t.TempDir()
	}
	p := &workerProc{root: root, metrics: freeAddr(t), exited: make(chan struct{})}
	var err error
	p.log, err = os.CreateTemp(t.TempDir(), "worker-*.log")
	require.NoError(t, err)
	p.cmd = f.env.command(t, nil, "worker", "--log-format", "json",
		"--server", server, "--token-file", f.tokenFile, "--slots", strconv.Itoa(slots),
		"--store", f.env.store, "--root", root, "--image", testImage, "--labels", "runtime=runc,image="+testImage,
		"--helpers-dir", f.env.helpers, "--drain-grace", testdeadline.Scale(30*time.Second).String(), "--lease-wait", "2s",
		"--metrics-listen", p.metrics, "--disk", "64m", "--max-output", "16m", "--timeout", "2m")
	p.cmd.Args = append(p.cmd.Args, extra...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	return p
}

// awaitRecovered waits until worker p finished its start-up recovery (its
// /readyz answers 200: recovered and not draining), so that a signal sent
// next meets a worker that leases, not one still finishing what a killed
// one left.
func awaitRecovered(t *testing.T, p *workerProc) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + p.metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, testdeadline.Scale(2*time.Minute), 50*time.Millisecond, "the restarted worker never finished its recovery")
}

// scrape parses the worker's /metrics.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(prommodel.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := name
			for _, l := range m.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key+"_count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// watchCreates follows the engine's container create events from now on
// (docker events, streamed: the engine keeps only a short backlog) and
// returns a function that stops following and counts them per run.
//
// Both ends wait on an event, not on time: watchCreates returns once the
// stream delivered the create of a marker container made after it
// subscribed, so no run's create can precede the subscription; the stop
// function makes a second marker and reads until its create arrived, so
// every earlier create was delivered (the engine sends a subscriber its
// events in order).
func watchCreates(t *testing.T) func() map[string]int {
	t.Helper()
	var out lockedbuf.Buffer
	// --since: the engine replays what happened while the CLI started.
	since := strconv.FormatInt(time.Now().Unix()-1, 10)
	cmd := exec.Command("docker", "events", "--since", since, "--filter", "type=container", "--filter", "event=create",
		"--filter", "label="+sandbox.LabelRun, "--format", `{{index .Actor.Attributes "`+sandbox.LabelRun+`"}}`)
	cmd.Stdout = &out
	require.NoError(t, cmd.Start())
	stopped := false
	kill := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	t.Cleanup(kill)
	awaitMarker(t, &out)
	return func() map[string]int {
		if !stopped {
			awaitMarker(t, &out)
			kill()
		}
		counts := map[string]int{}
		for _, run := range strings.Fields(out.String()) {
			counts[run]++
		}
		return counts
	}
}

// awaitMarker creates (and removes) a container labelled with a run ID of
// its own, not managed by taskrun, and waits until out, a create event
// stream, shows it; a marker made before the stream subscribed is not
// shown, so another is made every few seconds until one is.
func awaitMarker(t *testing.T, out *lockedbuf.Buffer) {
	t.Helper()
	// The engine reports a create within moments; the deadline only bounds
	// a stream that broke.
	deadline := time.After(testdeadline.Scale(time.Minute))
	for {
		marker := "events-marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		seen := out.Seen(marker + "\n")
		create := exec.Command("docker", "create", "--label", sandbox.LabelRun+"="+marker, "--name", marker, testImage, "true")
		msg, err := create.CombinedOutput()
		require.NoError(t, err, "docker create %s: %s", marker, msg)
		t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", marker).Run() })
		select {
		case <-seen:
			require.NoError(t, exec.Command("docker", "rm", "-f", marker).Run())
			return
		case <-time.After(3 * time.Second): // another marker; the last one may predate the subscription
			require.NoError(t, exec.Command("docker", "rm", "-f", marker).Run())
		case <-deadline:
			t.Fatalf("the engine's event stream never showed container %s; it has %q", marker, out.String())
		}
	}
}

// assertNoLoopDevices checks that no loop device is (still, once the kernel
// detached those of the last unmounts) backed by a file under one of roots:
// a disk cap's image, deleted or not.
func assertNoLoopDevices(t *testing.T, roots []string) {
	t.Helper()
	if _, err := exec.LookPath("losetup"); err != nil {
		return
	}
	var left []string
	assert.Eventually(t, func() bool {
		out, err := exec.Command("losetup", "-l", "-n", "-O", "BACK-FILE").Output()
		if err != nil {
			return true // no loop devices at all
		}
		left = left[:0]
		for _, line := range strings.Split(string(out), "\n") {
			for _, root := range roots {
				if strings.HasPrefix(strings.TrimSpace(line), root+"/") {
					left = append(left, strings.TrimSpace(line))
				}
			}
		}
		return len(left) == 0
	}, testdeadline.Scale(15*time.Second), 100*time.Millisecond, "loop devices left: %v", &left)
}

// The fleet tests' deadlines are written for an idle 2-core machine and
// scaled (internal/testdeadline): each bounds an event that is not coming (a
// run that never ends, a worker that never exits), and the time the events
// take grows with the machine's load.

// fleetLeaseTTL is the TTL of the fleet tests' leases: short, so that the
// killed worker's leases lapse soon, but scaled to the machine's speed, as
// a live worker must renew its leases within it (every second): on a loaded
// machine a renewal can be late by seconds, and the run is taken from a
// worker that is still running it.
func fleetLeaseTTL() time.Duration { return testdeadline.Scale(4 * time.Second) }

// leaseState is what awaitLeasesSettled needs to know of a run.
type leaseState struct {
	terminal, queued bool
	epoch            int64
}

// awaitLeasesSettled waits until every run of ids that is leased now (not
// terminal, not queued) has ended, been queued again or been leased again
// (its epoch grew): the live workers' runs end, and the leases a killed
// worker held lapse and are settled by the control plane.
func awaitLeasesSettled(t *testing.T, ids []string, state func(id string) leaseState) {
	t.Helper()
	leased := map[string]int64{}
	for _, id := range ids {
		if s := state(id); !s.terminal && !s.queued {
			leased[id] = s.epoch
		}
	}
	// A run ends within seconds and a lease lapses within its TTL; the
	// deadline only bounds a control plane that never settles one.
	require.Eventually(t, func() bool {
		for id, epoch := range leased {
			if s := state(id); !s.terminal && !s.queued && s.epoch == epoch {
				return false
			}
		}
		return true
	}, testdeadline.Scale(time.Minute)+fleetLeaseTTL(), 100*time.Millisecond, "the leases held when the worker was killed lapse")
}

// e2eRuns is how many runs the fleet test submits: TASKRUN_WORKER_E2E_RUNS,
// else 30 (100 makes the full version).
func e2eRuns(t *testing.T) int {
	if v := os.Getenv("TASKRUN_WORKER_E2E_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	return 30
}

// Three worker processes lease runs from one control plane; one is
// SIGKILLed midway and restarted on the same runs root. Every run ends
// exactly once with the right status, none stays RUNNING, no lease ran two
// containers, the restarted worker recovered what the killed one left, and
// nothing is left on the host. Then SIGTERM drains every worker: the live
// run finishes, nothing more is leased, and each exits 0.
func TestWorkerFleetSurvivesAKilledWorker(t *testing.T) {
	env := newCrashEnv(t)
	cp := controlplanetest.New(t, workerToken)
	cp.SetLeaseTiming(fleetLeaseTTL(), time.Second)
	n := e2eRuns(t)
	prefix := env.user + "-"
	retryable := map[string]bool{}
	for i := range n {
		id := fmt.Sprintf("%s%03d", prefix, i)
		retryable[id] = i%3 == 0
		cp.Enqueue(workerclient.Assignment{
			Task:      model.Task{ID: "t" + id, UserID: env.user, ConversationID: "c1", Prompt: "say hi"},
			Run:       model.TaskRun{ID: id, TaskID: "t" + id},
			SessionID: "s1",
			Image:     testImage, Runtime: "runc",
			Command:   []string{"sh", "-c", "echo run $TASKRUN_RUN_ID; sleep 0.5"},
			Limits:    workerclient.Limits{MemoryBytes: 128 << 20, TimeoutMillis: 60000},
			Retryable: retryable[id],
		})
	}
	fleet := newWorkerFleet(t, env, cp.URL())
	taskrunBin(t)
	countCreates := watchCreates(t)
	began := time.Now()
	victim := fleet.start("", 2)
	fleet.start("", 2)
	fleet.start("", 2)

	ended := func() (done int) {
		for id := range retryable {
			if cp.Lease(id).Status.Terminal() {
				done++
			}
		}
		return done
	}
	// Kill the victim while it holds runs.
	require.Eventually(t, func() bool {
		if ended() < n/4 {
			return false
		}
		m := scrape(t, victim.metrics)
		return m["taskrun_worker_slots_busy"] > 0
	}, testdeadline.Scale(5*time.Minute), 50*time.Millisecond)
	t.Logf("%s: %d runs ended; killing a worker", time.Since(began), ended())
	require.NoError(t, victim.cmd.Process.Signal(syscall.SIGKILL))
	<-victim.exited
	// Restart it once the control plane has given up on its leases, so
	// that every one of its runs is settled by the control plane.
	awaitLeasesSettled(t, slices.Collect(maps.Keys(retryable)), func(id string) leaseState {
		info := cp.Lease(id)
		return leaseState{terminal: info.Status.Terminal(), queued: info.Queued, epoch: info.Epoch}
	})
	restarted := fleet.start(victim.root, 2)

	require.Eventually(t, func() bool { return ended() == n }, testdeadline.Scale(10*time.Minute), 100*time.Millisecond, "every run ends")

	t.Logf("%s: all %d runs ended", time.Since(began), n)
	creates := countCreates()
	lost := 0
	for id, retry := range retryable {
		info := cp.Lease(id)
		holders := info.Holders
		require.NotEmpty(t, holders, id)
		switch {
		case info.Status == model.StatusSucceeded:
			assert.Equal(t, 1, info.Terminals, "run %s reported its end once", id)
			data, streamEnded, _ := cp.Stream(id)
			assert.True(t, streamEnded, id)
			assert.Equal(t, "run "+id+"\n", string(data), id)
		case info.Status == model.StatusFailed && info.Reason == controlplanetest.ReasonWorkerLost:
			lost++
			assert.False(t, retry, "a retryable run %s is queued again, not failed", id)
			assert.Zero(t, info.Terminals, "nobody reported run %s after its worker was lost", id)
		default:
			t.Errorf("run %s ended %s %q", id, info.Status, info.Reason)
		}
		if retry && len(holders) > 1 {
			assert.Greater(t, info.Epoch, int64(1), "a run leased again has a higher epoch")
		}
		// Each lease ran at most one container: the accepted PATCHes of a
		// run name one container per holder.
		ids := map[string]bool{}
		for _, p := range cp.Patches(id) {
			if p.Container != nil && p.Container.ID != "" {
				ids[p.Container.ID] = true
			}
		}
		assert.LessOrEqual(t, len(ids), len(holders), "run %s: containers %v for holders %v", id, ids, holders)
		assert.LessOrEqual(t, creates[id], len(holders), "run %s: the engine created %d containers for %d leases", id, creates[id], len(holders))
		if info.Status == model.StatusSucceeded {
			assert.Positive(t, creates[id], "run %s: the engine saw its container", id)
		}
		if !retry {
			assert.LessOrEqual(t, len(holders), 1, "a run that is not retryable is leased once")
		}
	}
	t.Logf("%d runs, %d finalized worker lost", n, lost)

	// The fleet's metrics carry the series.
	m := scrape(t, restarted.metrics)
	assert.Equal(t, 2.0, m["taskrun_worker_slots_total"])
	for _, series := range []string{"taskrun_worker_lease_acquisitions_total", "taskrun_worker_lease_renewals_total",
		"taskrun_worker_cold_start_seconds_count", "taskrun_worker_stream_bytes_total"} {
		_, ok := m[series]
		assert.True(t, ok, "series %s", series)
	}

	// Drain: a live run finishes, nothing more is leased, every worker exits 0.
	awaitRecovered(t, restarted)
	longID := prefix + "long"
	cp.Enqueue(workerclient.Assignment{
		Task: model.Task{ID: "tlong", UserID: env.user, ConversationID: "c1"}, Run: model.TaskRun{ID: longID, TaskID: "tlong"},
		SessionID: "s1", Image: testImage, Command: []string{"sh", "-c", "sleep 3; echo drained"},
	})
	require.Eventually(t, func() bool { return len(cp.Patches(longID)) > 0 }, testdeadline.Scale(time.Minute), 20*time.Millisecond, "the long run is RUNNING")
	var live []*workerProc
	for _, p := range fleet.procs {
		if p.cmd.ProcessState == nil && p != victim {
			live = append(live, p)
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		}
	}
	for _, p := range live {
		require.Eventually(t, func() bool {
			resp, err := http.Get("http://" + p.metrics + "/readyz")
			if err != nil {
				return true // already gone
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusServiceUnavailable
		}, testdeadline.Scale(time.Minute), 10*time.Millisecond, "a draining worker is not ready")
	}
	lateID := prefix + "late"
	cp.Enqueue(workerclient.Assignment{
		Task: model.Task{ID: "tlate", UserID: env.user, ConversationID: "c1"}, Run: model.TaskRun{ID: lateID, TaskID: "tlate"},
		SessionID: "s1", Image: testImage, Command: []string{"true"},
	})
	for _, p := range live {
		select {
		case <-p.exited:
		case <-time.After(testdeadline.Scale(2 * time.Minute)):
			t.Fatal("a draining worker did not exit")
		}
		assert.NoError(t, p.err, "a drained worker exits 0")
	}
	assert.Equal(t, model.StatusSucceeded, cp.Lease(longID).Status, "the live run finished during the drain")
	data, _, _ := cp.Stream(longID)
	assert.Equal(t, "drained\n", string(data))
	assert.True(t, cp.Lease(lateID).Queued, "no run is leased once draining")

	// Nothing is left on the host.
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label=dev.taskrun.managed", "--format", `{{.Label "dev.taskrun.run"}}`).Output()
	require.NoError(t, err)
	for _, run := range strings.Fields(string(out)) {
		assert.False(t, strings.HasPrefix(run, prefix), "container of run %s left", run)
	}
	mounts, err := os.ReadFile("/proc/mounts")
	require.NoError(t, err)
	var roots []string
	for _, p := range fleet.procs {
		roots = append(roots, p.root)
		assert.NotContains(t, string(mounts), p.root+"/", "a mount under a worker's root is left")
		entries, _ := os.ReadDir(filepath.Join(p.root, "journal"))
		for _, e := range entries {
			assert.False(t, strings.HasPrefix(e.Name(), prefix), "journal record %s left under %s", e.Name(), p.root)
		}
	}
	assertNoLoopDevices(t, roots)
}

// `taskrun worker --warm 1` parks a container of its default key before it
// leases anything; a leased run of that key runs in it (the run's container
// is the parked one, the metrics count a claim and no miss), the pool
// refills, and the drain removes every parked container and slot.
func TestWorkerWarmFlag(t *testing.T) {
	env := newCrashEnv(t)
	cp := controlplanetest.New(t, workerToken)
	fleet := newWorkerFleet(t, env, cp.URL())
	w := fleet.startOn(cp.URL(), "", 1, "--warm", "1")
	parkedUnder := func() []string {
		out, err := exec.Command("docker", "ps", "-a", "--filter", "label=dev.taskrun.pool",
			"--format", `{{.ID}} {{.Label "dev.taskrun.run-dir"}}`).Output()
		require.NoError(t, err)
		var ids []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			id, dir, _ := strings.Cut(line, " ")
			if strings.HasPrefix(dir, w.root+"/") {
				ids = append(ids, id)
			}
		}
		return ids
	}
	var parked []string
	require.Eventually(t, func() bool {
		parked = parkedUnder()
		return len(parked) == 1 && scrape(t, w.metrics)["taskrun_worker_warm_ready"] == 1
	}, testdeadline.Scale(2*time.Minute), 50*time.Millisecond, "the worker parks a container before any run")

	id := env.user + "-warm"
	cp.Enqueue(workerclient.Assignment{
		Task: model.Task{ID: "twarm", UserID: env.user, ConversationID: "c1"}, Run: model.TaskRun{ID: id, TaskID: "twarm"},
		SessionID: "s1", Image: testImage, Command: []string{"sh", "-c", "echo warm $TASKRUN_RUN_ID"},
	})
	require.Eventually(t, func() bool { return cp.Lease(id).Status.Terminal() }, testdeadline.Scale(2*time.Minute), 20*time.Millisecond)
	info := cp.Lease(id)
	require.Equal(t, model.StatusSucceeded, info.Status, info.Reason)
	data, _, _ := cp.Stream(id)
	assert.Equal(t, "warm "+id+"\n", string(data))
	var ran string
	for _, p := range cp.Patches(id) {
		if p.Container != nil && p.Container.ID != "" {
			ran = p.Container.ID
		}
	}
	assert.True(t, strings.HasPrefix(ran, parked[0]), "the run ran in the parked container %s, not %s", parked[0], ran)
	m := scrape(t, w.metrics)
	assert.Equal(t, 1.0, m["taskrun_worker_warm_claims_total"])
	assert.Zero(t, m["taskrun_worker_warm_misses_total"])
	assert.Zero(t, m["taskrun_worker_warm_audit_failures_total"])
	require.Eventually(t, func() bool { return len(parkedUnder()) == 1 }, testdeadline.Scale(2*time.Minute), 50*time.Millisecond, "the pool refills")

	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-w.exited:
	case <-time.After(testdeadline.Scale(2 * time.Minute)):
		t.Fatal("the worker did not exit")
	}
	assert.NoError(t, w.err, "a drained worker exits 0")
	assert.Empty(t, parkedUnder(), "no parked container is left")
	slots, _ := filepath.Glob(filepath.Join(w.root, "pool", "*", "*"))
	assert.Empty(t, slots, "no slot directory is left")
	mounts, err := os.ReadFile("/proc/mounts")
	require.NoError(t, err)
	assert.NotContains(t, string(mounts), w.root+"/", "no mount under the worker's root is left")
}
