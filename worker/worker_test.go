package worker_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/recovery"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/worker"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
	"github.com/taskrun/taskrun/workspace"
)

// These are unit tests of the worker's orchestration: a real HTTP control
// plane (controlplanetest) and the in-memory sandbox. The same paths with
// Docker and `taskrun serve` are tested in cmd/taskrun.

const token = "worker-token"

type fixture struct {
	cp    *controlplanetest.ControlPlane
	b     *sandboxfake.Backend
	store *persist.Store
	reg   *prometheus.Registry
	cfg   worker.Config
	// host configures the worker's host, built by start unless cfg.Host
	// is set.
	host executor.Config
	// release ends every "/agent/wait" container.
	release chan struct{}
	// terminated counts the "/agent/wait" containers asked to stop
	// (SIGTERM) rather than killed.
	terminated atomic.Int32
}

func newFixture(t *testing.T, opts ...sandboxfake.Option) *fixture {
	t.Helper()
	store, err := persist.Open(context.Background(), "mem://")
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	opts = append([]sandboxfake.Option{sandboxfake.WithMaxStopGrace(time.Millisecond)}, opts...)
	f := &fixture{
		cp: controlplanetest.New(t, token), b: sandboxfake.New(opts...), store: store,
		reg: prometheus.NewRegistry(), release: make(chan struct{}),
	}
	f.cp.SetLeaseTiming(time.Second, 200*time.Millisecond)
	f.b.Install("/agent/echo", func(_ context.Context, p *sandboxfake.Process) int {
		fmt.Fprintf(p.Stdout, "hello from %s\n", p.Getenv("TASKRUN_RUN_ID"))
		return 0
	})
	f.b.Install("/agent/wait", func(ctx context.Context, p *sandboxfake.Process) int {
		select {
		case <-f.release:
			fmt.Fprintln(p.Stdout, "released")
			return 0
		case <-p.Terminated():
			f.terminated.Add(1)
			return 143
		case <-ctx.Done():
			return sandboxfake.KilledExitCode
		}
	})
	f.b.Install("/agent/cat-home", func(_ context.Context, p *sandboxfake.Process) int {
		data, err := p.ReadFile("/taskrun/home/hello.txt")
		if err != nil {
			fmt.Fprintln(p.Stderr, err)
			return 1
		}
		_, _ = p.Stdout.Write(data)
		return 0
	})
	root := t.TempDir()
	f.cfg = worker.Config{
		Client: workerclient.New(f.cp.URL(), token, workerclient.WithAttemptTimeout(2*time.Second),
			workerclient.WithRetryPolicy(workerclient.RetryPolicy{MaxAttempts: 3, MaxElapsed: 2 * time.Second, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})),
		WorkerID:    "test-worker",
		Slots:       2,
		Labels:      workerclient.WorkerLabels{Runtimes: []string{"runc"}, Backend: "fake"},
		MemoryBytes: 8 << 30,
		Workspaces:  store,
		LeaseWait:   500 * time.Millisecond,
		DrainGrace:  time.Minute,
		Registry:    f.reg,
		FreeDisk:    func(string) (int64, error) { return 100 << 30, nil },
		Logger:      slog.New(slog.DiscardHandler),
	}
	f.host = executor.Config{
		Root:    root,
		Store:   store,
		Backend: f.b,
		Defaults: executor.Defaults{
			Image:          "fake/agent",
			Timeout:        time.Minute,
			DiskLimitBytes: -1, // the loop-mounted cap is tested with Docker
			MaxOutputBytes: 1 << 20,
			Policy:         sandbox.DefaultPolicy(),
		},
		ShutdownGrace: 10 * time.Second,
		Logger:        slog.New(slog.DiscardHandler),
	}
	return f
}

func assignment(runID, agent string) workerclient.Assignment {
	return workerclient.Assignment{
		Task:      model.Task{ID: "t-" + runID, UserID: "u1", ConversationID: "c1", Prompt: "do it"},
		Run:       model.TaskRun{ID: runID, TaskID: "t-" + runID},
		SessionID: "s1",
		Command:   []string{"/agent/" + agent},
	}
}

// start runs a worker with f.cfg until the returned stop is called; stop
// returns Run's error.
func (f *fixture) start(t *testing.T) (*worker.Worker, func() error) {
	t.Helper()
	f.buildHost(t)
	w, err := worker.New(f.cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(time.Minute):
			t.Fatal("the worker did not stop")
			return nil
		}
	}
	t.Cleanup(func() {
		select {
		case <-f.release:
		default:
			close(f.release)
		}
		_ = stop()
	})
	return w, stop
}

// buildHost builds cfg.Host from host, unless it is set.
func (f *fixture) buildHost(t *testing.T) {
	t.Helper()
	if f.cfg.Host != nil {
		return
	}
	h, err := executor.New(context.Background(), f.host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	f.cfg.Host = h
}

// final waits for runID's final status.
func (f *fixture) final(t *testing.T, runID string) controlplanetest.LeaseInfo {
	t.Helper()
	var info controlplanetest.LeaseInfo
	require.Eventually(t, func() bool {
		info = f.cp.Lease(runID)
		return info.Status.Terminal()
	}, 30*time.Second, 10*time.Millisecond, "run %s never ended", runID)
	return info
}

// requireFenced checks every PATCH and stream POST of runID carried epoch.
func (f *fixture) requireFenced(t *testing.T, runID string, epoch int64) {
	t.Helper()
	reqs := f.cp.Requests(runID)
	require.NotEmpty(t, reqs)
	for _, r := range reqs {
		assert.Equal(t, epoch, r.Fence, "%s %v of run %s", r.Method, r.Endpoint, runID)
	}
}

func TestWorkerLeasesAndRunsUpToItsSlots(t *testing.T) {
	f := newFixture(t)
	const n = 5
	for i := range n {
		f.cp.Enqueue(assignment(fmt.Sprintf("r%d", i), "echo"))
	}
	_, stop := f.start(t)
	for i := range n {
		id := fmt.Sprintf("r%d", i)
		info := f.final(t, id)
		assert.Equal(t, model.StatusSucceeded, info.Status, info.Reason)
		assert.Equal(t, 1, info.Terminals, "one terminal PATCH")
		assert.Equal(t, []string{"test-worker"}, info.Holders)
		data, ended, _ := f.cp.Stream(id)
		assert.True(t, ended)
		assert.Equal(t, "hello from "+id+"\n", string(data))
		f.requireFenced(t, id, 1)
	}
	require.NoError(t, stop())

	reqs := f.cp.LeaseRequests()
	require.NotEmpty(t, reqs)
	for _, r := range reqs {
		assert.Equal(t, "test-worker", r.WorkerID)
		assert.Equal(t, 2, r.Capacity.Slots)
		assert.Positive(t, r.Capacity.FreeSlots, "the worker asks only with a free slot")
		assert.LessOrEqual(t, r.Capacity.FreeSlots, 2)
		assert.Positive(t, r.Capacity.FreeMemoryBytes)
		assert.Positive(t, r.Capacity.FreeDiskBytes)
		assert.Equal(t, []string{"fake/agent"}, r.Labels.Images)
		assert.Equal(t, []string{"runc"}, r.Labels.Runtimes)
	}
	dumpRuns(t, f.reg)
	assert.InDelta(t, n, testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_runs_total", "SUCCEEDED")), 0)
	assert.InDelta(t, n, testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_lease_acquisitions_total", "")), 0)
	assert.Empty(t, f.b.Containers(nil), "every container was removed")
}

func TestWorkerDoesNotLeaseWhatItCannotPlace(t *testing.T) {
	cases := map[string]struct {
		change func(*fixture)
		reason string
	}{
		"memory": {func(f *fixture) { f.cfg.MemoryBytes = 256 << 20 }, "memory"},
		"disk":   {func(f *fixture) { f.cfg.FreeDisk = func(string) (int64, error) { return 1 << 20, nil } }, "disk"},
		"images": {func(f *fixture) { f.cfg.Images = []string{"not/here"} }, "images"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, sandboxfake.WithImages("fake/agent"))
			c.change(f)
			f.cp.Enqueue(assignment("r1", "echo"))
			_, stop := f.start(t)
			require.Eventually(t, func() bool {
				return testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_lease_skipped_total", c.reason)) >= 2
			}, 30*time.Second, 10*time.Millisecond)
			require.NoError(t, stop())
			assert.Empty(t, f.cp.LeaseRequests(), "no lease was asked for")
			assert.True(t, f.cp.Lease("r1").Queued, "the run is still queued for another worker")
		})
	}
}

func TestServerHandsOutOnlyRunsThatFit(t *testing.T) {
	f := newFixture(t)
	big := assignment("big", "echo")
	big.Limits.MemoryBytes = 64 << 30
	gvisor := assignment("gvisor", "echo")
	gvisor.Runtime = "runsc"
	f.cp.Enqueue(big)
	f.cp.Enqueue(gvisor)
	f.cp.Enqueue(assignment("fits", "echo"))
	_, stop := f.start(t)
	assert.Equal(t, model.StatusSucceeded, f.final(t, "fits").Status)
	require.NoError(t, stop())
	assert.True(t, f.cp.Lease("big").Queued, "a run over the worker's free memory is not handed out")
	assert.True(t, f.cp.Lease("gvisor").Queued, "a run needing a runtime the worker lacks is not handed out")
}

func TestWorkerRenewsTheLeaseOfALongRun(t *testing.T) {
	f := newFixture(t)
	f.cp.Enqueue(assignment("long", "wait"))
	_, stop := f.start(t)
	// A run far longer than its TTL keeps its lease by renewing it.
	// The control plane also counts the renewals that confirm the lease
	// before a store write; the worker's counter only its heartbeats.
	require.Eventually(t, func() bool {
		return f.cp.Lease("long").Renewals >= 8 &&
			testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_lease_renewals_total", "")) >= 8
	}, 30*time.Second, 10*time.Millisecond)
	close(f.release)
	info := f.final(t, "long")
	assert.Equal(t, model.StatusSucceeded, info.Status, info.Reason)
	require.NoError(t, stop())
	f.requireFenced(t, "long", 1)
	assert.Zero(t, f.cp.Stale("long"))
}

func TestLostLeaseStopsTheContainerAndReportsNothingMore(t *testing.T) {
	f := newFixture(t)
	f.cp.Enqueue(assignment("lost", "wait"))
	w, stop := f.start(t)
	require.Eventually(t, func() bool {
		return len(f.cp.Patches("lost")) == 1 && len(f.b.Containers(map[string]string{sandbox.LabelRun: "lost"})) == 1
	}, 30*time.Second, 10*time.Millisecond, "the run is RUNNING")

	f.cp.RevokeLease("lost")
	require.Eventually(t, func() bool { return len(w.Live()) == 0 }, 30*time.Second, 10*time.Millisecond, "the run ends")
	assert.Empty(t, f.b.Containers(nil), "the container was stopped and removed")
	assert.Zero(t, f.terminated.Load(), "the container was killed at once, not asked to stop with a grace")
	require.NoError(t, stop())

	patches := f.cp.Patches("lost")
	require.Len(t, patches, 1, "nothing was reported after the lease was lost")
	assert.Equal(t, model.StatusRunning, patches[0].Status)
	assert.Equal(t, 1, f.cp.Stale("lost"), "only the renewal that found the lease gone was refused")
	var after int
	for _, r := range f.cp.Requests("lost") {
		if r.Endpoint == controlplanetest.RenewEndpoint {
			after = 0
			continue
		}
		after++
	}
	assert.Zero(t, after, "no PATCH or stream POST after the refused renewal")
	assert.InDelta(t, 1, testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_leases_lost_total", "")), 0)
	keys, err := f.store.List(context.Background(), "")
	require.NoError(t, err)
	for _, k := range keys {
		if strings.Contains(k, "/index/") {
			continue // written while the lease held: checked below
		}
		assert.NotContains(t, k, "lost", "a run whose lease is lost stores nothing")
	}
	rec, err := runindex.Find(context.Background(), f.store, "lost", "u1")
	require.NoError(t, err, "the RUNNING record was written while the lease held")
	assert.Equal(t, model.StatusRunning, rec.Status, "the record is not rewritten once the lease is lost")
}

func TestLeaseNotRenewedForATTLStopsTheRun(t *testing.T) {
	f := newFixture(t)
	f.cp.Enqueue(assignment("silent", "wait"))
	w, stop := f.start(t)
	require.Eventually(t, func() bool { return len(f.cp.Patches("silent")) == 1 }, 30*time.Second, 10*time.Millisecond)
	// Every renewal from now on fails (a partitioned control plane).
	f.cp.InjectFaults(controlplanetest.Repeat(1000, controlplanetest.Fault{Endpoint: controlplanetest.RenewEndpoint, Status: 503})...)
	require.Eventually(t, func() bool { return len(w.Live()) == 0 }, 30*time.Second, 10*time.Millisecond)
	assert.Empty(t, f.b.Containers(nil))
	require.NoError(t, stop())
	assert.Len(t, f.cp.Patches("silent"), 1, "nothing reported once the lease lapsed on the worker's clock")
	assert.InDelta(t, 1, testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_leases_lost_total", "")), 0)
}

func TestOwnerCancelReportsCancelled(t *testing.T) {
	f := newFixture(t)
	f.cp.Enqueue(assignment("cancelme", "wait"))
	_, stop := f.start(t)
	require.Eventually(t, func() bool { return len(f.cp.Patches("cancelme")) == 1 }, 30*time.Second, 10*time.Millisecond)
	f.cp.CancelRun("cancelme")
	info := f.final(t, "cancelme")
	assert.Equal(t, model.StatusCancelled, info.Status)
	assert.Contains(t, info.Reason, worker.ErrCancelledByOwner.Error())
	assert.Equal(t, int32(1), f.terminated.Load(), "an owner's cancel stops the container with its grace (SIGTERM first)")
	require.NoError(t, stop())
	f.requireFenced(t, "cancelme", 1)
	assert.Empty(t, f.b.Containers(nil))
}

func TestDrainFinishesLiveRunsAndLeasesNoMore(t *testing.T) {
	f := newFixture(t)
	f.cp.Enqueue(assignment("live", "wait"))
	w, stop := f.start(t)
	require.Eventually(t, func() bool { return len(f.cp.Patches("live")) == 1 }, 30*time.Second, 10*time.Millisecond)
	require.True(t, w.Ready())

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	require.Eventually(t, func() bool { return !w.Ready() }, 30*time.Second, 10*time.Millisecond, "a draining worker is not ready")
	leasesAtDrain := len(f.cp.LeaseRequests())
	f.cp.Enqueue(assignment("late", "echo"))
	close(f.release)
	require.NoError(t, <-stopped)

	assert.Equal(t, model.StatusSucceeded, f.final(t, "live").Status, "the live run finished")
	assert.True(t, f.cp.Lease("late").Queued, "no run was leased once draining")
	assert.Equal(t, leasesAtDrain, len(f.cp.LeaseRequests()))
}

func TestDrainGraceOverCancelsLiveRuns(t *testing.T) {
	f := newFixture(t)
	f.cfg.DrainGrace = 100 * time.Millisecond
	f.cp.Enqueue(assignment("stuck", "wait"))
	_, stop := f.start(t)
	require.Eventually(t, func() bool { return len(f.cp.Patches("stuck")) == 1 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())
	info := f.cp.Lease("stuck")
	assert.Equal(t, model.StatusCancelled, info.Status)
	assert.Equal(t, "run cancelled: "+worker.ErrShuttingDown.Error(), info.Reason)
	assert.Empty(t, f.b.Containers(nil))
}

// packWorkspace stores a workspace tar holding hello.txt and returns it.
func (f *fixture) packWorkspace(t *testing.T, key string) *workerclient.StoredObject {
	t.Helper()
	home := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(home, "hello.txt"), []byte("from the workspace\n"), 0o644))
	var buf bytes.Buffer
	_, err := workspace.PackHome(context.Background(), home, &buf, workspace.PackOptions{})
	require.NoError(t, err)
	sum := sha256.Sum256(buf.Bytes())
	info, err := f.store.PutGlobalFile(context.Background(), "u1", key, bytes.NewReader(buf.Bytes()), "application/gzip")
	require.NoError(t, err)
	return &workerclient.StoredObject{Key: info.Key, Size: int64(buf.Len()), SHA256: hex.EncodeToString(sum[:])}
}

func TestWorkspaceIsDownloadedCheckedAndUnpacked(t *testing.T) {
	f := newFixture(t)
	obj := f.packWorkspace(t, "workspaces/ws.tar.gz")
	good := assignment("ws", "cat-home")
	good.Workspace = obj
	bad := assignment("tampered", "cat-home")
	tampered := *obj
	tampered.SHA256 = hex.EncodeToString(make([]byte, 32))
	bad.Workspace = &tampered
	f.cp.Enqueue(good)
	f.cp.Enqueue(bad)
	_, stop := f.start(t)

	info := f.final(t, "ws")
	assert.Equal(t, model.StatusSucceeded, info.Status, info.Reason)
	data, _, _ := f.cp.Stream("ws")
	assert.Equal(t, "from the workspace\n", string(data))

	info = f.final(t, "tampered")
	assert.Equal(t, model.StatusFailed, info.Status)
	assert.Contains(t, info.Reason, "does not match the assignment")
	require.NoError(t, stop())
	for _, s := range f.b.Started() {
		assert.NotEqual(t, "tampered", s.Run.RunID, "a run with a tampered workspace never starts")
	}
	entries, err := os.ReadDir(f.cfg.Host.Layout().WorkerWorkspacesDir())
	if err == nil {
		assert.Empty(t, entries, "downloaded workspaces are removed")
	}
}

func TestRecoveryComesBeforeLeasingAndKeptRunsAreRetried(t *testing.T) {
	f := newFixture(t)
	f.cp.Enqueue(assignment("after", "echo"))
	var leasesAtRecovery atomic.Int64
	leasesAtRecovery.Store(-1)
	proceed := make(chan struct{})
	var w *worker.Worker
	readyDuringRecovery := atomic.Bool{}
	f.cfg.Recover = func(context.Context) {
		leasesAtRecovery.Store(int64(len(f.cp.LeaseRequests())))
		<-proceed
	}
	var retries atomic.Int64
	f.cfg.RetryKept = func(context.Context) int { retries.Add(1); return 1 }
	f.cfg.RetryBackoff = recovery.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond, Idle: time.Millisecond}
	w, stop := f.start(t)
	srv := httptest.NewServer(w.Handler())
	defer srv.Close()
	require.Eventually(t, func() bool { return leasesAtRecovery.Load() >= 0 }, 30*time.Second, 10*time.Millisecond)
	readyDuringRecovery.Store(w.Ready())
	resp, err := http.Get(srv.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "not ready while recovering")
	close(proceed)

	assert.Equal(t, model.StatusSucceeded, f.final(t, "after").Status)
	require.Eventually(t, func() bool { return retries.Load() >= 3 }, 30*time.Second, time.Millisecond, "kept runs are retried in the background")
	resp, err = http.Get(srv.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, stop())
	assert.Zero(t, leasesAtRecovery.Load(), "no lease before recovery finished")
	assert.False(t, readyDuringRecovery.Load())
	resp, err = http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(body), "taskrun_worker_slots_total 2")
}

// counter finds the series name{label} in reg (label "" for none).
func counter(t *testing.T, reg *prometheus.Registry, name, label string) prometheus.Collector {
	t.Helper()
	return collectorFunc(func() float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				if label != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[0].GetValue() != label) {
					continue
				}
				switch {
				case m.GetCounter() != nil:
					return m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					return m.GetGauge().GetValue()
				}
			}
		}
		return 0
	})
}

// collectorFunc is a gauge whose value is computed on collection.
func collectorFunc(f func() float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "probe", Help: "probe"}, f)
}

func dumpRuns(t *testing.T, reg *prometheus.Registry) {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "taskrun_worker_runs_total" {
			for _, m := range mf.GetMetric() {
				t.Logf("%v %v", m.GetLabel(), m.GetCounter().GetValue())
			}
		}
	}
}

func TestLeaseIsCountedFromItsHandOutNotFromThePoll(t *testing.T) {
	f := newFixture(t)
	const ttl = time.Second
	f.cp.SetLeaseTiming(ttl, 200*time.Millisecond)
	f.cfg.LeaseWait = 10 * ttl
	w, stop := f.start(t)
	// The worker's poll is held, idle, for more than the whole TTL before
	// the run comes: counted from the poll, the lease would be over before
	// the worker got it.
	require.Eventually(t, func() bool { return len(f.cp.LeaseRequests()) == 1 }, 30*time.Second, 10*time.Millisecond)
	time.Sleep(ttl + ttl/2)
	require.Len(t, f.cp.LeaseRequests(), 1, "the poll is still held")
	f.cp.Enqueue(assignment("late", "wait"))
	require.Eventually(t, func() bool { return f.cp.Lease("late").Renewals >= 3 }, 30*time.Second, 10*time.Millisecond,
		"the run handed out late in the poll keeps its lease")
	require.Len(t, w.Live(), 1)
	close(f.release)
	info := f.final(t, "late")
	assert.Equal(t, model.StatusSucceeded, info.Status, info.Reason)
	require.NoError(t, stop())
	assert.Zero(t, testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_leases_lost_total", "")))
	f.requireFenced(t, "late", 1)
}

func TestShutdownIsBoundedWhenTheControlPlaneHangs(t *testing.T) {
	f := newFixture(t)
	// The production client: each attempt may take 10 s, and a stream POST
	// is retried for up to 2 minutes.
	f.cfg.Client = workerclient.New(f.cp.URL(), token, workerclient.WithLogger(slog.New(slog.DiscardHandler)))
	f.cfg.DrainGrace = 100 * time.Millisecond
	f.host.ShutdownGrace = time.Second
	f.b.Install("/agent/chatty", func(ctx context.Context, p *sandboxfake.Process) int {
		for i := 0; ; i++ {
			fmt.Fprintf(p.Stdout, "line %d\n", i)
			select {
			case <-p.Terminated():
				return 143
			case <-ctx.Done():
				return sandboxfake.KilledExitCode
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	f.cp.Enqueue(assignment("chatty", "chatty"))
	_, stop := f.start(t)
	require.Eventually(t, func() bool {
		data, _, _ := f.cp.Stream("chatty")
		return len(f.cp.Patches("chatty")) == 1 && len(data) > 0
	}, 30*time.Second, 10*time.Millisecond, "the run is RUNNING and streaming")

	// The control plane hangs: every call from now on is held, unanswered.
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	f.cp.InjectFaults(controlplanetest.Repeat(100000, controlplanetest.Fault{Hold: hang})...)
	// The lease lapses on the worker's clock (no renewal answered for a
	// TTL) while a stream POST of the run is held.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_leases_lost_total", "")) == 1
	}, 30*time.Second, 10*time.Millisecond, "the lease is lost")

	// SIGTERM: the lost run's stream POSTs must not outlast the shutdown
	// bound (the drain grace, then the run's shutdown grace).
	bound := f.cfg.DrainGrace + f.host.ShutdownGrace
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(bound + 10*time.Second):
		t.Fatalf("the worker did not stop within %s of its shutdown bound", bound)
	}
	assert.Empty(t, f.b.Containers(nil))
}

func TestShutdownIsBoundedWhenARefusalHangs(t *testing.T) {
	f := newFixture(t)
	f.cfg.Client = workerclient.New(f.cp.URL(), token, workerclient.WithLogger(slog.New(slog.DiscardHandler)))
	f.cfg.DrainGrace = 100 * time.Millisecond
	f.host.ShutdownGrace = time.Second
	// The control plane hands out a run the worker cannot place (a model it
	// lacks), then hangs on its PATCH and renewals.
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	f.cp.InjectFaults(controlplanetest.Repeat(1000, controlplanetest.Fault{Endpoint: controlplanetest.PatchEndpoint, Hold: hang})...)
	f.cp.InjectFaults(controlplanetest.Repeat(1000, controlplanetest.Fault{Endpoint: controlplanetest.RenewEndpoint, Hold: hang})...)
	a := assignment("unplaceable", "echo")
	a.Model = "no-such-model"
	f.cp.Enqueue(a)
	_, stop := f.start(t)
	require.Eventually(t, func() bool {
		patched := false
		for _, r := range f.cp.Requests("unplaceable") {
			patched = patched || r.Endpoint == controlplanetest.PatchEndpoint
		}
		return patched && testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_leases_lost_total", "")) == 1
	}, 30*time.Second, 10*time.Millisecond, "the refusal is held and the lease lost")

	bound := f.cfg.DrainGrace + f.host.ShutdownGrace
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(bound + 10*time.Second):
		t.Fatalf("the worker did not stop within %s of its shutdown bound", bound)
	}
}
