// Package worker is the long-lived host executor: it leases runs from a
// control plane (docs/control-plane-api.md, "Leasing") and executes each
// on its executor.Host, up to Config.Slots at once.
//
// # Lifecycle
//
//	w, err := worker.New(cfg)   // checks cfg; nothing runs yet
//	go http.Serve(l, w.Handler()) // /metrics, /healthz, /readyz
//	err = w.Run(ctx)            // until ctx ends, then drains
//
// Run first recovers what an earlier worker process on this host left
// (executor.Host.Recover: journaled runs of dead executors are stored and reported,
// their containers and mounts reaped), and only then becomes ready and leases.
// It keeps retrying, in the background, runs whose persisting failed
// (executor.Host.RetryKept, driven by recovery.RetryLoop).
//
// The lease loop asks for a run (a long poll) only while it has a free slot
// and room to place one: free disk under the runs root, memory not yet
// granted to the runs it holds, and the images it offers present locally;
// each request reports that capacity and the worker's labels. A run the
// control plane hands out that the worker cannot place after all (an image
// gone meanwhile, a runtime it lacks, a bad workspace) is reported FAILED
// with the reason, without starting anything.
//
// Each run gets a client fenced with its lease's epoch as its updater and
// stream sender, and a renewal goroutine that renews every renew_ms on the
// monotonic clock. When a renewal is refused (the lease is lost) or none
// succeeded for a whole TTL, the run's context is cancelled with the cause and
// from that moment nothing more is reported or streamed for the run: its
// container is stopped and its outputs stored, but the control plane already
// owns the run's fate. A renewal that answers cancel: true cancels the run,
// which reports CANCELLED.
//
// # Drain
//
// When ctx ends, Run stops leasing at once (an outstanding long poll is
// abandoned), lets the live runs finish within Config.DrainGrace, then
// cancels those still running with the cause ErrShuttingDown: they report
// CANCELLED with the reason "run cancelled: worker shutting down". Run returns
// nil once every run has reported (each bounded by the host's
// ShutdownGrace).
package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/internal/backoff"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/recovery"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/warmpool"
	"github.com/taskrun/taskrun/workerclient"
)

// ErrShuttingDown is the cause runs are cancelled with when a drain outlasts
// Config.DrainGrace.
var ErrShuttingDown = errors.New("worker shutting down")

// ErrCancelledByOwner is the cause a run is cancelled with when its renewal
// answers cancel: true.
var ErrCancelledByOwner = errors.New("cancelled by its owner")

// ErrLeaseExpired is the cause a run is stopped with when no renewal
// succeeded for a whole TTL on the worker's clock.
var ErrLeaseExpired = errors.New("lease not renewed within its TTL")

// Defaults of Config.
const (
	DefaultLeaseWait  = 20 * time.Second
	DefaultDrainGrace = 5 * time.Minute
	// DefaultMaxWorkspaceBytes caps a workspace tar's stored size.
	DefaultMaxWorkspaceBytes = 1 << 30
)

// WorkspaceStore opens an object of the shared store by key (persist.Store).
type WorkspaceStore interface {
	Open(ctx context.Context, key string) (io.ReadCloser, error)
}

// Config is a worker's setup. Client, WorkerID, Slots and Host are
// required.
type Config struct {
	// Client speaks to the control plane with the worker token.
	Client *workerclient.Client
	// WorkerID names this worker process (host name plus instance ID).
	WorkerID string
	// Slots is how many runs may execute at once.
	Slots int
	// Host is the machine the runs execute on (package executor): its
	// backend, store, runs root (free disk is measured there, downloaded
	// workspaces are unpacked under it), warm pool, and the defaults every
	// run starts from (image, policy, limits). The worker fills in each
	// run's task, session, lease and whatever the assignment sets.
	Host *executor.Host
	// Labels are sent with every lease request. Images is replaced by those
	// of Images that are present locally at the time of the request.
	Labels workerclient.WorkerLabels
	// Images are the images the worker offers; the host's default image
	// when empty.
	Images []string
	// MemoryBytes is the memory the worker may grant runs in all (the sum of
	// their limits); the host's MemTotal when zero.
	MemoryBytes int64
	// Workspaces is the shared store workspace tars are read from; an
	// assignment with a workspace fails without it.
	Workspaces WorkspaceStore
	// Records is the shared store's run index, where the checkpoint of a
	// run leased to be resumed is found (its record's Checkpoint); the
	// host's store when nil and it is a *persist.Store. A worker without
	// one reports a resumed run PAUSED again, with the reason.
	Records *persist.Store
	// MaxWorkspaceBytes caps a workspace tar; DefaultMaxWorkspaceBytes when 0.
	MaxWorkspaceBytes int64
	// Models resolves an assignment's model name to the host's entry (with
	// its upstream and key); nil accepts only runs without a model.
	Models func(name string) (config.ModelEntry, error)
	// Egress is the operator's egress configuration. A run's egress policy
	// is what it grants the run's tenant for the assignment's request
	// (egress.Operator.Grant). The zero value
	// gives every run no network and refuses a run asking for any.
	Egress egress.Operator
	// RunMaxima are the largest limits an assignment may ask for (zero
	// fields: runlimits.Default); an assignment over one is refused. The
	// host's defaults must be within them.
	RunMaxima runlimits.Maxima
	// LeaseWait is how long one lease call may be held: DefaultLeaseWait.
	LeaseWait time.Duration
	// DrainGrace is how long live runs may go on once Run's ctx ended:
	// DefaultDrainGrace when zero.
	DrainGrace time.Duration
	// Recover is called once before the first lease: it finishes what
	// earlier executors on this host left; Host.Recover when nil.
	Recover func(ctx context.Context)
	// RetryKept retries every kept run once and returns how many are still
	// kept; Run calls it in the background (recovery.RetryLoop);
	// Host.RetryKept when nil.
	RetryKept func(ctx context.Context) int
	// RetryBackoff spaces RetryKept; recovery.DefaultBackoff when zero.
	RetryBackoff recovery.Backoff
	// Registry receives the worker's metrics; a new registry when nil.
	Registry *prometheus.Registry
	// FreeDisk measures the free bytes of a directory; statfs when nil.
	FreeDisk func(dir string) (int64, error)
	// Logger receives the worker's log; slog.Default() when nil.
	Logger *slog.Logger
	// Live serves the live API (processes, files, ports, usage) of the
	// keep-alive runs the worker holds; nil refuses keep-alive runs. Its
	// MaxIdle bounds their idle timeout. LiveEndpoint is where its
	// LiveHandler is reached, sent to the control plane with every lease
	// request.
	Live         *daemon.Server
	LiveEndpoint *workerclient.LiveEndpoint
	// PauseOnIdle pauses an idle live run (executor.Host.Pause: it is
	// reported PAUSED) instead of stopping it.
	PauseOnIdle bool
}

// Worker leases and executes runs. Create it with New.
type Worker struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	reg     *prometheus.Registry

	mu       sync.Mutex
	live     map[string]*liveRun
	memUsed  int64
	diskUsed int64
	freed    chan struct{} // closed and replaced when a run ends

	ready    atomic.Bool
	draining atomic.Bool
	wg       sync.WaitGroup
}

// New checks cfg and returns a worker that has not started.
func New(cfg Config) (*Worker, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("worker: Config.Client is required")
	case cfg.WorkerID == "":
		return nil, errors.New("worker: Config.WorkerID is required")
	case cfg.Slots <= 0:
		return nil, fmt.Errorf("worker: %d slots: give at least 1", cfg.Slots)
	case cfg.Host == nil:
		return nil, errors.New("worker: Config.Host is required: build it with executor.New")
	case cfg.Host.Backend() == nil:
		return nil, errors.New("worker: the host has no backend: set executor.Config.Backend")
	}
	def := cfg.Host.Defaults()
	if len(cfg.Images) == 0 {
		cfg.Images = []string{def.Image}
	}
	if err := cfg.Egress.Validate(); err != nil {
		return nil, fmt.Errorf("worker: the operator's egress: %w", err)
	}
	cfg.RunMaxima = cfg.RunMaxima.WithDefaults()
	if err := cfg.RunMaxima.CheckDefaults(runlimits.Maxima{Timeout: def.Timeout, MemoryBytes: def.Policy.MemoryBytes,
		CPUs: float64(def.Policy.NanoCPUs) / 1e9, PIDs: def.Policy.PidsLimit, DiskBytes: def.DiskLimitBytes, MaxOutputBytes: def.MaxOutputBytes}); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if cfg.LeaseWait <= 0 {
		cfg.LeaseWait = DefaultLeaseWait
	}
	if cfg.DrainGrace <= 0 {
		cfg.DrainGrace = DefaultDrainGrace
	}
	if cfg.MaxWorkspaceBytes <= 0 {
		cfg.MaxWorkspaceBytes = DefaultMaxWorkspaceBytes
	}
	if cfg.RetryBackoff == (recovery.Backoff{}) {
		cfg.RetryBackoff = recovery.DefaultBackoff
	}
	if cfg.FreeDisk == nil {
		cfg.FreeDisk = statfsFree
	}
	if cfg.MemoryBytes <= 0 {
		m, err := hostMemory()
		if err != nil {
			return nil, fmt.Errorf("worker: host memory: %w (set Config.MemoryBytes)", err)
		}
		cfg.MemoryBytes = m
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Recover == nil {
		cfg.Recover = cfg.Host.Recover
	}
	if cfg.RetryKept == nil {
		cfg.RetryKept = cfg.Host.RetryKept
	}
	w := &Worker{cfg: cfg, log: log, reg: cfg.Registry, live: map[string]*liveRun{}, freed: make(chan struct{})}
	m, err := newMetrics(cfg.Registry, cfg.Slots)
	if err != nil {
		return nil, err
	}
	w.metrics = m
	if pool := cfg.Host.WarmPool(); pool != nil {
		if err := registerWarm(cfg.Registry, pool); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Handler serves /metrics (Prometheus text format), /healthz (the process is
// up) and /readyz (recovery finished and not draining).
func (w *Worker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.reg, promhttp.HandlerOpts{Registry: w.reg}))
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) { _, _ = rw.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if !w.Ready() {
			http.Error(rw, "not ready: recovering or draining", http.StatusServiceUnavailable)
			return
		}
		_, _ = rw.Write([]byte("ready\n"))
	})
	return mux
}

// Ready reports whether start-up recovery finished and the worker is not
// draining.
func (w *Worker) Ready() bool { return w.ready.Load() && !w.draining.Load() }

// Live returns the IDs of the runs the worker holds now.
func (w *Worker) Live() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.live))
	for id := range w.live {
		ids = append(ids, id)
	}
	return ids
}

// Run recovers, then leases and executes runs until ctx ends, then drains
// (see the package documentation). It returns nil after a drain.
func (w *Worker) Run(ctx context.Context) error {
	// Runs live on a context of their own: ctx ending drains them, it does
	// not cancel them.
	runsCtx, cancelRuns := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelRuns(ErrShuttingDown)
	// The parked containers go once the runs that may claim them drained.
	defer w.closeWarm()

	w.cfg.Recover(ctx)
	var warm *warmpool.Template
	if w.cfg.Host.WarmPool() != nil {
		t, err := w.warmTemplate(ctx)
		if err != nil {
			w.log.Warn("no warm containers for the default runs: runs start cold", "err", err)
		} else {
			warm = &t
		}
	}
	w.ready.Store(true)
	w.log.Info("worker ready", "worker", w.cfg.WorkerID, "slots", w.cfg.Slots, "warm", warm != nil)

	retryCtx, stopRetry := context.WithCancel(runsCtx)
	retryDone := make(chan struct{})
	go func() {
		defer close(retryDone)
		recovery.RetryLoop(retryCtx, w.cfg.RetryBackoff, w.cfg.RetryKept, nil)
	}()

	w.leaseLoop(ctx, runsCtx, warm)

	w.draining.Store(true)
	w.log.Info("draining: no more leases", "live", len(w.Live()), "grace", w.cfg.DrainGrace)
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.cfg.DrainGrace):
		w.log.Warn("drain grace over: cancelling the live runs", "live", len(w.Live()))
		w.cancelAll(ErrShuttingDown)
		<-done
	}
	stopRetry()
	<-retryDone
	w.log.Info("worker stopped")
	return nil
}

// leaseLoop leases runs while ctx lasts.
func (w *Worker) leaseLoop(ctx, runsCtx context.Context, warm *warmpool.Template) {
	exp := backoff.Exponential{Initial: 200 * time.Millisecond, Max: 10 * time.Second}
	failures := 0
	for ctx.Err() == nil {
		w.keepWarm(warm)
		capacity, why := w.capacity(ctx)
		if why != "" {
			w.metrics.leaseSkipped.WithLabelValues(why).Inc()
			w.waitForRoom(ctx)
			continue
		}
		req := workerclient.LeaseRequest{
			WorkerID: w.cfg.WorkerID, Capacity: capacity, Labels: w.labels(ctx),
			WaitMillis: w.cfg.LeaseWait.Milliseconds(), Live: w.cfg.LiveEndpoint,
		}
		sent := time.Now()
		a, err := w.cfg.Client.AcquireLease(ctx, req)
		received := time.Now()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			w.metrics.leaseErrors.Inc()
			d := exp.Delay(failures)
			w.log.Warn("lease request failed", "err", err, "retry_in", d)
			sleep(ctx, d)
			continue
		}
		failures = 0
		if a == nil {
			continue
		}
		w.metrics.leases.Inc()
		w.start(runsCtx, a, handedOut(a.Lease, sent, received))
	}
}

// handedOut is when, on the worker's monotonic clock, the control plane
// handed the lease out: the call's sending time plus how long the control
// plane says it held the call, never after the answer arrived. It is never
// later than the control plane's own hand-out time (the call's transit
// comes on top), so the worker's idea of the lease's expiry never outlasts
// the control plane's. A run handed out late in a long poll keeps its
// whole TTL.
func handedOut(l workerclient.Lease, sent, received time.Time) time.Time {
	waited := time.Duration(max(l.WaitedMillis, 0)) * time.Millisecond
	return sent.Add(min(waited, received.Sub(sent)))
}

// waitForRoom waits until a run ends, ctx ends, or a while passes (free
// disk may come back without a run ending).
func (w *Worker) waitForRoom(ctx context.Context) {
	w.mu.Lock()
	freed := w.freed
	w.mu.Unlock()
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-freed:
	case <-ctx.Done():
	case <-t.C:
	}
}

// cancelAll cancels every live run with cause.
func (w *Worker) cancelAll(cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.live {
		r.cancel(cause)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// workspaceDir is where a run's downloaded workspace is unpacked.
func (w *Worker) workspaceDir(runID string, epoch int64) string {
	return filepath.Join(w.cfg.Host.Layout().WorkerWorkspacesDir(), fmt.Sprintf("%s.%d", runID, epoch))
}

// removeAll removes dir, logging a failure.
func (w *Worker) removeAll(dir string) {
	if err := os.RemoveAll(dir); err != nil {
		w.log.Warn("remove a downloaded workspace", "dir", dir, "err", err)
	}
}
