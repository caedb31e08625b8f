package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/docker/docker/client"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workspace"
)

// WorkspacesDirName holds, under the runs root, the workspaces clients
// sent, while their runs copy them.
const WorkspacesDirName = "daemon-workspaces"

// maxRequestLine caps the JSON line of a RunRequest.
const maxRequestLine = 1 << 20

// Config is a daemon's machine and the operator's word on what a tenant
// may ask for.
type Config struct {
	// Host runs the runs (required, with a backend and a store).
	Host *executor.Host
	// Maxima bound each request's limits (zero fields: runlimits.Default).
	Maxima runlimits.Maxima
	// Egress is the operator's egress policy: a request's egress is
	// granted by it (the zero Operator: no network).
	Egress egress.Operator
	// Models resolves a request's model name (nil: no models).
	Models func(name string) (config.ModelEntry, error)
	// Tenant maps a peer uid to its tenant; UserNameTenant when nil.
	Tenant func(uid uint32) (string, error)
	// Records is the store whose runs clients read (taskrun runs, inspect,
	// logs, cp...), each its tenant's only; nil: the daemon serves none.
	Records *persist.Store
	// StoreURL names the host's store to clients (without credentials).
	StoreURL string
	// Logger receives the daemon's log; the host's when nil.
	Logger *slog.Logger
	// MaxIdle stops a keep-alive run after this long with no call on it
	// (zero: DefaultMaxIdle).
	MaxIdle time.Duration
}

// DefaultMaxIdle is a keep-alive run's idle timeout when Config.MaxIdle is zero.
const DefaultMaxIdle = 10 * time.Minute

// Server serves runs on one executor.Host to local clients.
type Server struct {
	cfg Config
	log *slog.Logger
	dir string

	mu   sync.Mutex
	runs map[string]*liveRun
	// paused are the live runs paused through this daemon, by run ID: what
	// a resume restores; a paused run is also stored (pausedRequestName),
	// for a resume by a daemon that did not pause it.
	paused map[string]*pausedRun
	wg     sync.WaitGroup

	dockerOnce sync.Once
	docker     client.APIClient
	dockerErr  error

	// watches counts the daemon's open file watches (MaxWatches).
	watches atomic.Int32
}

// liveRun is a run in progress, for the cancel, process and file endpoints.
type liveRun struct {
	uid    uint32
	cancel context.CancelFunc
	// ref names the run's objects.
	ref persist.RunRef
	// used is when a call last touched the run (unix nanoseconds).
	used atomic.Int64
	// container is the run's container ID once the run reported it.
	container atomic.Pointer[string]
	// ctx is the run's: its commands end with it.
	ctx context.Context
	// usage is the run's resource usage at the last live sample.
	usage atomic.Pointer[sandbox.Usage]
	// watches counts the run's open file watches (MaxWatchesPerRun).
	watches atomic.Int32

	// procMu guards the run's commands: procs by ID, order oldest first.
	procMu   sync.Mutex
	procs    map[string]*process
	order    []string
	nextProc int
	// spec is the run as it was asked for, for a resume; req is its
	// request, stored with a paused run for a resume by another daemon.
	spec executor.Spec
	req  RunRequest

	// ports are the run's declared ports and their tokens (fixed at its
	// start); portConns holds a slot per open connection to them.
	ports     map[int]string
	portConns chan struct{}

	// maxIdle, when set, is the run's own idle timeout, at most the
	// daemon's MaxIdle; onIdle, when set, ends an idle run (else it is
	// cancelled). Both are an attached run's (Attach).
	maxIdle time.Duration
	onIdle  func()
}

// pausedRun is a live run paused through the daemon: its caller's uid,
// its spec and the checkpoint its outcome named.
type pausedRun struct {
	uid        uint32
	spec       executor.Spec
	req        RunRequest
	checkpoint checkpoint.Manifest
}

// touch marks the run used now.
func (r *liveRun) touch() { r.used.Store(time.Now().UnixNano()) }

// New checks cfg and returns the server.
func New(cfg Config) (*Server, error) {
	if cfg.Host == nil {
		return nil, errors.New("daemon: Config.Host is required")
	}
	if cfg.Host.Backend() == nil || cfg.Host.Store() == nil {
		return nil, errors.New("daemon: the host needs a backend and a store to run on")
	}
	if err := cfg.Egress.Validate(); err != nil {
		return nil, fmt.Errorf("daemon: egress: %w", err)
	}
	d := cfg.Host.Defaults()
	cfg.Maxima = cfg.Maxima.WithDefaults()
	if err := cfg.Maxima.CheckDefaults(runlimits.Maxima{Timeout: d.Timeout, MemoryBytes: d.Policy.MemoryBytes,
		CPUs: float64(d.Policy.NanoCPUs) / 1e9, PIDs: d.Policy.PidsLimit, DiskBytes: d.DiskLimitBytes, MaxOutputBytes: d.MaxOutputBytes}); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	if cfg.Tenant == nil {
		cfg.Tenant = UserNameTenant
	}
	if cfg.Logger == nil {
		cfg.Logger = cfg.Host.Logger()
	}
	if cfg.MaxIdle <= 0 {
		cfg.MaxIdle = DefaultMaxIdle
	}
	dir := filepath.Join(cfg.Host.Layout().Root(), WorkspacesDirName)
	// A killed daemon's staged workspaces are of no use to anyone.
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	return &Server{cfg: cfg, log: cfg.Logger, dir: dir, runs: map[string]*liveRun{}, paused: map[string]*pausedRun{}}, nil
}

// Listen listens on the unix socket path: its directory is created 0755,
// a stale socket (nothing answers) is replaced, and the socket is made
// 0666, since every request is checked against its peer's credentials.
// A live daemon's socket is refused.
func Listen(path string) (net.Listener, error) {
	if path == "" {
		return nil, fmt.Errorf("daemon: no socket path: set $%s or $XDG_RUNTIME_DIR, or run as root", EnvSocket)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("daemon: socket directory: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("daemon: a daemon already answers at %s: stop it first", path)
	} else if errors.Is(err, syscall.ECONNREFUSED) {
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("daemon: stale socket: %w", err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("daemon: %w", err)
	}
	return l, nil
}

// Handler is the protocol's HTTP handler; a server built with it must set
// ConnContext to the one Serve uses, or every request is refused.
func (s *Server) handler(ctx context.Context) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+PathRuns, func(w http.ResponseWriter, r *http.Request) { s.serveRun(ctx, w, r) })
	mux.HandleFunc("POST "+PathCancel, s.serveCancel)
	mux.HandleFunc("POST "+PathExec, s.serveExec)
	mux.HandleFunc("POST "+PathProcesses, s.serveProcesses)
	mux.HandleFunc("GET "+PathProcesses, s.serveProcesses)
	mux.HandleFunc("GET "+PathProcess, s.serveProcess)
	mux.HandleFunc("GET "+PathProcessOutput, s.serveProcessOutput)
	mux.HandleFunc("POST "+PathProcessStdin, s.serveProcessStdin)
	mux.HandleFunc("POST "+PathProcessSignal, s.serveProcessSignal)
	mux.HandleFunc("GET "+PathUsage, s.serveUsage)
	mux.HandleFunc("POST "+PathPause, s.servePause)
	mux.HandleFunc("POST "+PathResume, func(w http.ResponseWriter, r *http.Request) { s.serveResume(ctx, w, r) })
	mux.HandleFunc("POST "+PathFork, func(w http.ResponseWriter, r *http.Request) { s.serveFork(ctx, w, r) })
	mux.HandleFunc(PathFiles, s.serveFiles)
	mux.HandleFunc("GET "+PathPorts, s.servePorts)
	mux.HandleFunc(PathPort, s.servePort)
	mux.HandleFunc("GET "+PathRecords, s.serveRecords)
	mux.HandleFunc("GET "+PathRecord, s.serveRecord)
	mux.HandleFunc("GET "+PathRecordLog, s.serveRecordLog)
	mux.HandleFunc("GET "+PathRecordObject, s.serveRecordObject)
	return mux
}

// Serve serves l until ctx ends, then cancels the live runs, lets them
// wind down within the host's shutdown grace and returns.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	s.keepWarm(ctx)
	srv := &http.Server{Handler: s.handler(ctx), ConnContext: withPeer, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// The runs' contexts derive from ctx: they are winding down.
	grace := s.cfg.Host.ShutdownGrace() + 5*time.Second
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	s.wg.Wait()
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("daemon: runs did not wind down within %s: %w", grace, err)
	}
	return nil
}

// refuse answers a refused request.
func refuse(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(ErrorBody{Error: err.Error()})
}

// serveRun runs one request's run and streams it back.
func (s *Server) serveRun(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	peer, err := peerFrom(r.Context())
	if err != nil {
		refuse(w, http.StatusForbidden, fmt.Errorf("refused: %w", err))
		return
	}
	br := bufio.NewReaderSize(io.LimitReader(r.Body, 1<<62), 64<<10)
	line, err := readLine(br)
	if err != nil {
		refuse(w, http.StatusBadRequest, err)
		return
	}
	var req RunRequest
	if err := json.Unmarshal(line, &req); err != nil {
		refuse(w, http.StatusBadRequest, fmt.Errorf("run request: %w", err))
		return
	}
	log := s.log.With("run", req.RunID, "uid", peer.UID, "pid", peer.PID)
	spec, status, err := s.spec(peer, req)
	if err != nil {
		log.Warn("refused a run", "err", err)
		refuse(w, status, err)
		return
	}
	log = log.With("user", spec.Task.UserID)
	// cleanup removes the staged workspace once the run is done with it.
	cleanup := func() {}
	defer func() { cleanup() }()
	if req.Workspace {
		dir, err := os.MkdirTemp(s.dir, req.RunID+"-")
		if err != nil {
			refuse(w, http.StatusInternalServerError, err)
			return
		}
		cleanup = func() { _ = os.RemoveAll(dir) }
		home := filepath.Join(dir, "home")
		if _, err := workspace.UnpackHome(r.Context(), br, home, workspace.UnpackOptions{}); err != nil {
			refuse(w, http.StatusBadRequest, fmt.Errorf("workspace: %w", err))
			return
		}
		spec.Task.WorkspaceDir = home
	}

	// Read the body to its end: only then does net/http watch the
	// connection and end r.Context() when the client goes away.
	if n, err := io.Copy(io.Discard, io.LimitReader(br, 1<<20)); err != nil || n > 0 {
		refuse(w, http.StatusBadRequest, fmt.Errorf("run request: %d bytes after the request and its workspace (%v)", n, err))
		return
	}
	tokens, err := portTokens(req.Ports)
	if err != nil {
		refuse(w, http.StatusInternalServerError, err)
		return
	}
	runCtx, cancel := context.WithCancel(ctx)
	live := &liveRun{uid: peer.UID, cancel: cancel, ctx: runCtx, spec: spec, req: req, procs: map[string]*process{}, ref: persist.RunRef{
		UserID: spec.Task.UserID, ConversationID: spec.Task.ConversationID, TaskID: spec.Run.TaskID, RunID: spec.Run.ID},
		ports: tokens, portConns: make(chan struct{}, MaxPortConns)}
	live.touch()
	s.mu.Lock()
	if _, dup := s.runs[req.RunID]; dup {
		s.mu.Unlock()
		cancel()
		refuse(w, http.StatusConflict, fmt.Errorf("run %s is already running: give another --run-id", req.RunID))
		return
	}
	s.runs[req.RunID] = live
	s.mu.Unlock()
	s.wg.Add(1)
	if req.KeepAlive {
		// The run outlives its request: it ends when cancelled, idle or
		// timed out, and is stored as any run.
		done := cleanup
		cleanup = func() {}
		running := make(chan *Result, 1)
		go func() {
			defer s.wg.Done()
			defer done()
			s.runLive(ctx, runCtx, live, spec, log, running, s.cfg.Host.Run)
		}()
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		fw := &frameWriter{w: w, rc: http.NewResponseController(w)}
		fw.flush()
		// The client hears once the agent runs, or how the run ended first.
		if res := <-running; res != nil {
			fw.write(Frame{Result: res})
			return
		}
		fw.write(Frame{Started: req.RunID})
		return
	}
	defer s.wg.Done()
	defer cancel()
	// A client that goes away cancels its run; the run winds down here.
	defer context.AfterFunc(r.Context(), cancel)()
	defer s.forget(req.RunID)

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fw := &frameWriter{w: w, rc: http.NewResponseController(w)}
	fw.flush()
	spec.StreamSender = workerclient.NewWriterStreamSender(streamWriter{fw, false})
	spec.Stderr = streamWriter{fw, true}
	spec.Updater = executor.LogUpdater{Log: log}
	spec.Timings = timings.New(nil)
	log.Info("run started")
	out, err := s.cfg.Host.Run(runCtx, spec)
	res := &Result{Outcome: out, User: spec.Task.UserID, Store: s.cfg.StoreURL}
	if err != nil {
		res.Error = err.Error()
		res.CannotRun = out == nil || (out.ContainerID == "" && out.Status == model.StatusFailed)
	}
	var ended model.RunStatus
	if out != nil {
		ended = out.Status
	}
	log.Info("run ended", "status", ended, "client_gone", r.Context().Err() != nil)
	s.keepWarm(ctx)
	fw.write(Frame{Result: res})
}

// readLine reads the request's JSON line.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxRequestLine {
			return nil, fmt.Errorf("run request: over %d bytes", maxRequestLine)
		}
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, fmt.Errorf("run request: %w", err)
		}
	}
}

// spec checks the request as its peer's and builds the run's spec; the
// status is the HTTP status of a refusal.
func (s *Server) spec(peer Peer, req RunRequest) (executor.Spec, int, error) {
	tenant, err := s.cfg.Tenant(peer.UID)
	if err != nil {
		return executor.Spec{}, http.StatusForbidden, fmt.Errorf("uid %d has no tenant: %w", peer.UID, err)
	}
	user := tenant
	if req.User != "" && req.User != tenant {
		if peer.UID != 0 {
			return executor.Spec{}, http.StatusForbidden, fmt.Errorf("user %q: uid %d runs as tenant %q only: drop --user or pass --user %s", req.User, peer.UID, tenant, tenant)
		}
		user = req.User
	}
	if err := s.cfg.Maxima.Check(req.Limits); err != nil {
		return executor.Spec{}, http.StatusForbidden, err
	}
	spec := executor.Spec{
		Task: &model.Task{ID: req.Task, UserID: user, ConversationID: req.Conversation, Prompt: req.Prompt},
		Run:  &model.TaskRun{ID: req.RunID, TaskID: req.Task, PreviousRunID: req.ResumeFrom, Status: model.StatusRunning},
		// Validate wants an Updater; serveRun sets the real one.
		Updater:   executor.LogUpdater{Log: s.log},
		SessionID: req.Session, Image: req.Image, Command: req.Command, Entrypoint: req.Entrypoint, Env: req.Env,
		SessionExcludes: req.SessionExcludes, ChangeExcludes: req.ChangeExcludes, KeepRunDir: req.KeepRunDir,
	}
	if len(req.Ports) > 0 && !req.KeepAlive {
		return spec, http.StatusBadRequest, errors.New("ports: only a live run (keep_alive) declares ports")
	}
	if err := checkPorts(req.Ports); err != nil {
		return spec, http.StatusBadRequest, err
	}
	if req.KeepAlive && len(spec.Command) == 0 && len(spec.Entrypoint) == 0 {
		spec.Entrypoint, spec.Command = IdleCommand[:1], IdleCommand[1:]
	}
	if err := spec.Validate(); err != nil {
		return spec, http.StatusBadRequest, err
	}
	lim := req.Limits
	policy := s.cfg.Host.Defaults().Policy
	if lim.MemoryBytes > 0 {
		policy.MemoryBytes = lim.MemoryBytes
	}
	if lim.CPUs > 0 {
		policy.NanoCPUs = int64(lim.CPUs * 1e9)
	}
	if lim.PIDs > 0 {
		policy.PidsLimit = lim.PIDs
	}
	spec.Policy = &policy
	spec.Timeout = time.Duration(lim.TimeoutMillis) * time.Millisecond
	spec.DiskLimitBytes, spec.MaxOutputBytes = lim.DiskBytes, lim.MaxOutputBytes
	if req.Model != "" {
		if s.cfg.Models == nil {
			return spec, http.StatusForbidden, fmt.Errorf("model %q: this daemon serves no models", req.Model)
		}
		if spec.Model, err = s.cfg.Models(req.Model); err != nil {
			return spec, http.StatusForbidden, fmt.Errorf("model %q: %w", req.Model, err)
		}
	}
	spec.Model.MaxTokens, spec.Model.MaxRequests = int(lim.MaxTokens), req.MaxRequests
	if len(req.Egress) > 0 {
		treq, err := egress.ParseTenantRequest(req.Egress)
		if err != nil {
			return spec, http.StatusBadRequest, err
		}
		if spec.Egress, err = s.cfg.Egress.Grant(user, treq); err != nil {
			return spec, http.StatusForbidden, err
		}
	}
	return spec, 0, nil
}

// warmID names the placeholder spec of the warm pool's key.
const warmID = "warm"

// keepWarm asks the host's warm pool, if it has one, to keep containers of
// the default spec's key ready (the pool forgets a key left idle).
func (s *Server) keepWarm(ctx context.Context) {
	pool := s.cfg.Host.WarmPool()
	if pool == nil || ctx.Err() != nil {
		return
	}
	policy := s.cfg.Host.Defaults().Policy
	tmpl, err := s.cfg.Host.WarmTemplate(ctx, executor.Spec{
		Task: &model.Task{ID: warmID, UserID: warmID, ConversationID: warmID}, Run: &model.TaskRun{ID: warmID, TaskID: warmID},
		SessionID: warmID, Updater: executor.LogUpdater{Log: s.log}, Policy: &policy,
	})
	if err == nil {
		err = pool.Warm(tmpl)
	}
	if err != nil {
		s.log.Warn("keep warm containers", "err", err)
	}
}

// serveCancel cancels a live run of the peer's (root may cancel any).
func (s *Server) serveCancel(w http.ResponseWriter, r *http.Request) {
	peer, err := peerFrom(r.Context())
	if err != nil {
		refuse(w, http.StatusForbidden, err)
		return
	}
	id := r.PathValue("id")
	s.mu.Lock()
	run, ok := s.runs[id]
	s.mu.Unlock()
	if !ok || (run.uid != peer.UID && peer.UID != 0) {
		// The same answer whether the run is another uid's or not live.
		refuse(w, http.StatusNotFound, fmt.Errorf("run %s: no live run of yours by that id", id))
		return
	}
	run.cancel()
	s.log.Info("run cancelled by its client", "run", id, "uid", peer.UID)
	w.WriteHeader(http.StatusNoContent)
}

// servePause pauses the peer's live run through the host and answers its
// outcome once the run ended PAUSED.
func (s *Server) servePause(w http.ResponseWriter, r *http.Request) {
	run, peer, ok := s.liveOf(w, r)
	if !ok {
		return
	}
	id := run.ref.RunID
	out, err := s.cfg.Host.Pause(r.Context(), id)
	switch {
	case errors.Is(err, executor.ErrNotLive):
		refuse(w, http.StatusConflict, err)
		return
	case err != nil:
		refuse(w, http.StatusInternalServerError, err)
		return
	}
	s.log.Info("run paused by its client", "run", id, "uid", peer.UID, "status", out.Status)
	if out.Checkpoint != nil {
		s.mu.Lock()
		s.paused[id] = &pausedRun{uid: run.uid, spec: run.spec, req: run.req, checkpoint: *out.Checkpoint}
		s.mu.Unlock()
		if err := s.storePaused(r.Context(), run); err != nil {
			// This daemon resumes it still; another one cannot.
			s.log.Warn("paused run: its request was not stored: only this daemon can resume it", "run", id, "err", err)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// serveResume resumes the peer's run paused through the daemon as a live
// run again (executor.Host.Resume), answering as a detached run's start:
// once its agent runs, or how it ended first. A checkpoint the host
// refuses leaves the run paused.
func (s *Server) serveResume(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	peer, err := peerFrom(r.Context())
	if err != nil {
		refuse(w, http.StatusForbidden, err)
		return
	}
	id := r.PathValue("id")
	s.mu.Lock()
	pr, ok := s.paused[id]
	_, live := s.runs[id]
	if ok && (pr.uid == peer.UID || peer.UID == 0) && !live {
		delete(s.paused, id)
	}
	s.mu.Unlock()
	if !ok && !live {
		// Paused by another daemon, or by this one before it restarted.
		var status int
		if pr, status, err = s.loadPaused(r.Context(), peer, id); err != nil {
			refuse(w, status, err)
			return
		}
		ok = true
	}
	if !ok || (pr.uid != peer.UID && peer.UID != 0) {
		refuse(w, http.StatusNotFound, fmt.Errorf("run %s: no paused run of yours by that id", id))
		return
	}
	if live {
		refuse(w, http.StatusConflict, fmt.Errorf("run %s is live", id))
		return
	}
	spec := pr.spec
	log := s.log.With("run", id, "uid", peer.UID, "user", spec.Task.UserID)
	runCtx, cancel := context.WithCancel(ctx)
	// The resumed run serves its processes and declared ports again, the
	// ports under fresh tokens (GET PathPorts lists them).
	tokens, err := portTokens(pr.req.Ports)
	if err != nil {
		cancel()
		refuse(w, http.StatusInternalServerError, err)
		return
	}
	lr := &liveRun{uid: pr.uid, cancel: cancel, ctx: runCtx, spec: spec, req: pr.req, procs: map[string]*process{}, ref: persist.RunRef{
		UserID: spec.Task.UserID, ConversationID: spec.Task.ConversationID, TaskID: spec.Run.TaskID, RunID: spec.Run.ID},
		ports: tokens, portConns: make(chan struct{}, MaxPortConns)}
	lr.touch()
	s.mu.Lock()
	s.runs[id] = lr
	s.mu.Unlock()
	running := make(chan *Result, 1)
	resume := func(ctx context.Context, spec executor.Spec) (*executor.Outcome, error) {
		out, err := s.cfg.Host.Resume(ctx, spec, pr.checkpoint)
		if out == nil && err != nil {
			// Refused before it ran: the run stays paused.
			s.mu.Lock()
			s.paused[id] = pr
			s.mu.Unlock()
		}
		return out, err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.runLive(ctx, runCtx, lr, spec, log, running, resume)
	}()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fw := &frameWriter{w: w, rc: http.NewResponseController(w)}
	fw.flush()
	if res := <-running; res != nil {
		fw.write(Frame{Result: res})
		return
	}
	fw.write(Frame{Started: id})
}

// frameWriter writes frames to a response, one JSON line each, flushed.
// Once the client is gone, writes fail and are dropped: the run goes on
// to its end (cancelled) and is stored as usual.
type frameWriter struct {
	mu  sync.Mutex
	w   io.Writer
	rc  *http.ResponseController
	enc *json.Encoder
}

func (f *frameWriter) write(fr Frame) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.enc == nil {
		f.enc = json.NewEncoder(f.w)
	}
	if f.enc.Encode(fr) == nil {
		_ = f.rc.Flush()
	}
}

func (f *frameWriter) flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	_ = f.rc.Flush()
}

// streamWriter is one of the run's streams as frames.
type streamWriter struct {
	f      *frameWriter
	stderr bool
}

func (s streamWriter) Write(p []byte) (int, error) {
	fr := Frame{Stdout: p}
	if s.stderr {
		fr = Frame{Stderr: p}
	}
	s.f.write(fr)
	return len(p), nil
}
