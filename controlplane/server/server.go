// Package server is taskrun's reference control plane over HTTP (`taskrun
// serve`): the user API (submit tasks, list and read runs, follow output,
// cancel), the worker API (long-poll leases, renewals, fenced PATCH and output
// stream), the lease-expiry sweeper, Prometheus metrics, health and readiness.
// Its state lives in a controlplane.Store; the protocol is
// docs/control-plane-api.md.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/workerclient"
)

// Limits bound everything a client controls.
type Limits struct {
	// MaxPromptBytes caps a task's prompt.
	MaxPromptBytes int
	// MaxTaskBytes caps a task's JSON description (prompt included).
	MaxTaskBytes int64
	// MaxWorkspaceBytes caps an uploaded workspace archive.
	MaxWorkspaceBytes int64
	// MaxOutputBytes caps the output stream the server holds per run.
	MaxOutputBytes int64
	// MaxFollowersPerRun caps concurrent output readers of one run, and
	// MaxFollowers those of all runs together.
	MaxFollowersPerRun int
	MaxFollowers       int
	// MaxListLimit caps ?limit= on GET /v1/runs.
	MaxListLimit int
	// MaxQueuedPerUser caps a user's runs waiting in the queue: one more
	// submission is answered 429.
	MaxQueuedPerUser int
	// MaxFileBytes caps one stored object of a run served by the record
	// routes (patch, change list, file); a larger one is answered 413.
	MaxFileBytes int64
}

// DefaultLimits are the limits of a zero Config.
var DefaultLimits = Limits{
	MaxPromptBytes:     256 << 10,
	MaxTaskBytes:       512 << 10,
	MaxWorkspaceBytes:  256 << 20,
	MaxOutputBytes:     64 << 20,
	MaxFollowersPerRun: 8,
	MaxFollowers:       1024,
	MaxListLimit:       controlplane.MaxListLimit,
	MaxQueuedPerUser:   1000,
	MaxFileBytes:       256 << 20,
}

// Config configures a Server.
type Config struct {
	// Store holds the control plane's state.
	Store controlplane.Store
	// Blobs is the shared blob store workers read workspaces from; nil
	// refuses submissions that upload a workspace.
	Blobs *persist.Store
	// Tokens authenticate workers and users.
	Tokens *Tokens
	// LeaseTTL is a lease's length (default 15 s); workers renew every third.
	LeaseTTL time.Duration
	// SweepInterval is how often expired leases are looked for (default a
	// third of LeaseTTL).
	SweepInterval time.Duration
	// PollInterval is how often long polls and followers look at the
	// database for changes made by other replicas (default 500 ms).
	PollInterval time.Duration
	// Limits bound clients (zero fields: DefaultLimits).
	Limits Limits
	// RunMaxima are the largest run limits a submission may ask for (zero
	// fields: runlimits.Default); a submission over one is refused (400).
	RunMaxima runlimits.Maxima
	// Now is the clock (default time.Now); tests inject one.
	Now func() time.Time
	// Log receives the server's log (default slog.Default()).
	Log *slog.Logger
	// Runtimes are the OCI runtimes the workers offer; a submission asking
	// for another is refused. Empty: any runtime name is accepted.
	Runtimes []string
	// QueueTTL is how long a run may wait QUEUED: past it, the sweep ends
	// it FAILED, saying so. Zero: runs wait for ever.
	QueueTTL time.Duration
	// UI, when set, is mounted under /ui/ behind user authentication
	// (UserFromContext names the user); it reads through Store's
	// controlplane.RunReader methods.
	UI http.Handler
}

// Server is the control plane. Create it with New, serve Handler, and run
// Sweep in the background.
type Server struct {
	cfg     Config
	m       *metrics
	runs    notifier // key: run ID, and queueKey
	handler http.Handler

	// live are the workers' live APIs; liveTransport reaches them.
	live          liveEndpoints
	liveTransport http.RoundTripper

	fmu       sync.Mutex
	followers map[string]int
	nFollow   int
}

// New checks cfg and returns the server.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("server: no store")
	}
	if cfg.Tokens == nil {
		return nil, errors.New("server: no tokens")
	}
	if err := cfg.Tokens.Check(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 15 * time.Second
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = cfg.LeaseTTL / 3
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 500 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	l, d := &cfg.Limits, DefaultLimits
	for _, f := range []struct{ p, d *int }{{&l.MaxPromptBytes, &d.MaxPromptBytes}, {&l.MaxFollowersPerRun, &d.MaxFollowersPerRun},
		{&l.MaxFollowers, &d.MaxFollowers}, {&l.MaxListLimit, &d.MaxListLimit}, {&l.MaxQueuedPerUser, &d.MaxQueuedPerUser}} {
		if *f.p <= 0 {
			*f.p = *f.d
		}
	}
	for _, f := range []struct{ p, d *int64 }{{&l.MaxTaskBytes, &d.MaxTaskBytes}, {&l.MaxWorkspaceBytes, &d.MaxWorkspaceBytes}, {&l.MaxOutputBytes, &d.MaxOutputBytes}, {&l.MaxFileBytes, &d.MaxFileBytes}} {
		if *f.p <= 0 {
			*f.p = *f.d
		}
	}
	l.MaxListLimit = min(l.MaxListLimit, controlplane.MaxListLimit)
	s := &Server{cfg: cfg, m: newMetrics(cfg.Store), followers: map[string]int{}, liveTransport: http.DefaultTransport.(*http.Transport).Clone()}
	s.handler = s.routes()
	return s, nil
}

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	// Worker API.
	mux.HandleFunc("POST /v1/leases", s.requireWorker(s.handleLease))
	mux.HandleFunc("POST /v1/leases/{id}/renew", s.requireWorker(s.handleRenew))
	mux.HandleFunc("PATCH /v1/task-runs/{id}", s.requireWorker(s.handlePatch))
	mux.HandleFunc("POST /v1/task-runs/{id}/stream", s.requireWorker(s.handleStream))
	// User API.
	mux.Handle("POST /v1/tasks", s.requireUser(http.HandlerFunc(s.handleSubmit)))
	mux.Handle("GET /v1/runs", s.requireUser(http.HandlerFunc(s.handleListRuns)))
	mux.Handle("GET /v1/runs/{id}", s.requireUser(http.HandlerFunc(s.handleGetRun)))
	mux.Handle("GET /v1/runs/{id}/output", s.requireUser(http.HandlerFunc(s.handleOutput)))
	mux.Handle("GET /v1/runs/{id}/attestation", s.requireUser(http.HandlerFunc(s.handleAttestation)))
	mux.Handle("GET /v1/runs/{id}/record", s.requireUser(http.HandlerFunc(s.handleRecord)))
	mux.Handle("GET /v1/runs/{id}/patch", s.requireUser(http.HandlerFunc(s.handleChangesPatch)))
	mux.Handle("GET /v1/runs/{id}/changes", s.requireUser(http.HandlerFunc(s.handleChanges)))
	mux.Handle("GET /v1/runs/{id}/files/{path...}", s.requireUser(http.HandlerFunc(s.handleFile)))
	mux.Handle("POST /v1/runs/{id}/cancel", s.requireUser(http.HandlerFunc(s.handleCancel)))
	mux.Handle("POST /v1/runs/{id}/resume", s.requireUser(http.HandlerFunc(s.handleResume)))
	mux.Handle("POST /v1/runs/{id}/fork", s.requireUser(http.HandlerFunc(s.handleFork)))
	mux.Handle("GET /v1/workers", s.requireUser(http.HandlerFunc(s.handleWorkers)))
	for _, p := range liveRoutes {
		mux.Handle(p, s.requireUser(http.HandlerFunc(s.handleLive)))
	}
	// Operations.
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{Registry: s.m.reg, ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.handleReady)
	if s.cfg.UI != nil {
		mux.Handle("/ui/", s.requireUser(s.cfg.UI))
	}
	return mux
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := s.cfg.Store.Ready(ctx); err != nil {
		s.cfg.Log.Warn("not ready", "err", err)
		writeError(w, http.StatusServiceUnavailable, "database not ready")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// Sweep finalizes or requeues runs whose lease lapsed, every SweepInterval
// until ctx ends. Every replica may run it: the store's transactions make
// concurrent sweeps safe.
func (s *Server) Sweep(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		if _, err := s.SweepOnce(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Log.Error("lease sweep", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SweepOnce runs one sweep and returns what it expired: lapsed leases, then
// runs queued past Config.QueueTTL (Expired.Status FAILED, not Requeued).
func (s *Server) SweepOnce(ctx context.Context) ([]controlplane.Expired, error) {
	ex, err := s.cfg.Store.ExpireLeases(ctx, s.cfg.Now())
	if err != nil {
		return nil, err
	}
	if err := s.expireQueued(ctx); err != nil {
		return ex, err
	}
	for _, e := range ex {
		outcome := "failed"
		switch {
		case e.Requeued:
			outcome = "requeued"
			s.runs.notify(queueKey)
		case e.Status == "CANCELLED":
			outcome = "cancelled"
		}
		s.m.expiries.WithLabelValues(outcome).Inc()
		s.runs.notify(e.RunID)
		s.cfg.Log.Warn("lease expired: worker lost", "run", e.RunID, "outcome", outcome)
	}
	return ex, nil
}

// expireQueued ends FAILED every run that waited QUEUED longer than
// Config.QueueTTL: no worker took it, and none would.
func (s *Server) expireQueued(ctx context.Context) error {
	if s.cfg.QueueTTL <= 0 {
		return nil
	}
	now := s.cfg.Now()
	reason := fmt.Sprintf("%s: no worker started it within the queue's time to live of %s (serve --queue-ttl)", controlplane.ErrorQueueExpired, s.cfg.QueueTTL)
	ids, err := s.cfg.Store.ExpireQueued(ctx, now.Add(-s.cfg.QueueTTL), now, reason)
	if err != nil {
		return fmt.Errorf("expire queued runs: %w", err)
	}
	for _, id := range ids {
		s.m.expiries.WithLabelValues("queue_expired").Inc()
		s.runs.notify(id)
		s.cfg.Log.Warn("run expired in the queue", "run", id, "queue_ttl", s.cfg.QueueTTL)
	}
	return nil
}

// Read deadlines for request bodies: a client that sends too slowly is cut
// off instead of holding a connection and a handler forever.
const (
	uploadDeadline = 15 * time.Minute // a task with its workspace
	bodyDeadline   = time.Minute      // every other body
)

// readDeadline bounds the time left to read r's body; the returned func lifts
// the bound once the body is read (a deadline left in place would end the
// request's context when it passes).
func readDeadline(w http.ResponseWriter, d time.Duration) func() {
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(d)) != nil {
		return func() {}
	}
	return func() { _ = rc.SetReadDeadline(time.Time{}) }
}

// errorBody is the JSON body of every error answer.
type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, errorBody{Error: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// storeError answers a store error with its status.
func (s *Server) storeError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, controlplane.ErrNotFound):
		writeError(w, http.StatusNotFound, "no such run")
	case errors.Is(err, controlplane.ErrStaleFence):
		writeError(w, http.StatusPreconditionFailed, err.Error())
	case errors.Is(err, controlplane.ErrNotHolder):
		writeError(w, http.StatusForbidden, "this worker does not hold the run's lease: send the lease's token in "+
			workerclient.HeaderLeaseToken+", with the credential of the worker it was handed to")
	case errors.Is(err, controlplane.ErrConflict), errors.Is(err, controlplane.ErrFinished):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, controlplane.ErrTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err.Error())
	case r.Context().Err() != nil:
		// The client left; nothing to answer.
	default:
		s.cfg.Log.Error("store", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, "internal error")
	}
}
