package daemon

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
)

// CallerHeader names, on a call to a LiveHandler, who made it (a tenant
// through the control plane): it is what the run's records say ran a
// command. The live handler trusts it, as it trusts its caller.
const CallerHeader = "X-Taskrun-Caller"

// AttachOptions is a live run another component runs on the daemon's host
// (a worker's leased keep-alive run), for Attach.
type AttachOptions struct {
	// Ref names the run and its objects.
	Ref persist.RunRef
	// Ports are its declared ports (checked as a RunRequest's).
	Ports []int
	// MaxIdle is its idle timeout, at most the daemon's MaxIdle (zero: the
	// daemon's).
	MaxIdle time.Duration
	// Cancel stops the run; OnIdle, when set, ends it once idle instead
	// (a pause), and should cancel it if it cannot.
	Cancel context.CancelFunc
	OnIdle func()
}

// Attached is a run Attach made live: its spec hooks keep the live API's
// view of it current.
type Attached struct {
	s    *Server
	live *liveRun
}

// Attach makes a run the caller runs itself (ctx is its context: its
// commands end with it) reachable through LiveHandler: processes, files,
// ports, usage and cancel, with its idle timeout watched. Hook the spec
// with Attached.Hook before running it, and Detach once it ended.
func (s *Server) Attach(ctx context.Context, o AttachOptions) (*Attached, error) {
	if err := checkPorts(o.Ports); err != nil {
		return nil, err
	}
	if o.Cancel == nil {
		return nil, errors.New("daemon: attach: no Cancel")
	}
	tokens, err := portTokens(o.Ports)
	if err != nil {
		return nil, err
	}
	req := RunRequest{RunID: o.Ref.RunID, KeepAlive: true, Ports: o.Ports}
	live := &liveRun{cancel: o.Cancel, ctx: ctx, req: req, procs: map[string]*process{}, ref: o.Ref,
		ports: tokens, portConns: make(chan struct{}, MaxPortConns), maxIdle: o.MaxIdle, onIdle: o.OnIdle}
	live.touch()
	s.mu.Lock()
	if _, dup := s.runs[o.Ref.RunID]; dup {
		s.mu.Unlock()
		return nil, fmt.Errorf("daemon: run %s is already live", o.Ref.RunID)
	}
	s.runs[o.Ref.RunID] = live
	s.mu.Unlock()
	go s.watchIdle(ctx, live, s.log.With("run", o.Ref.RunID))
	return &Attached{s: s, live: live}, nil
}

// Hook sets spec's OnUsage to keep the run's usage, and wraps its Updater
// to learn its container.
func (a *Attached) Hook(spec *executor.Spec) {
	prev := spec.OnUsage
	spec.OnUsage = func(u sandbox.Usage) {
		a.live.usage.Store(&u)
		if prev != nil {
			prev(u)
		}
	}
	spec.Updater = containerUpdater{TaskRunUpdater: spec.Updater, live: a.live}
}

// Usage is the run's usage at the last sample, nil before the first.
func (a *Attached) Usage() *sandbox.Usage { return a.live.usage.Load() }

// Detach makes the run unreachable through the live API.
func (a *Attached) Detach() { a.s.forget(a.live.ref.RunID) }

// containerUpdater records the run's container from its status reports.
type containerUpdater struct {
	executor.TaskRunUpdater
	live *liveRun
}

// UpdateRunStatus implements executor.TaskRunUpdater.
func (u containerUpdater) UpdateRunStatus(ctx context.Context, runID string, req *workerclient.PatchTaskRunRequest) error {
	if req.Container != nil && req.Container.ID != "" {
		u.live.container.Store(&req.Container.ID)
	}
	if req.Status == model.StatusRunning {
		// Its idle time counts from when its agent runs, not from its
		// lease: a slow start is not idleness.
		u.live.touch()
	}
	return u.TaskRunUpdater.UpdateRunStatus(ctx, runID, req)
}

// LiveHandler serves the live API of the daemon's runs (processes, exec,
// files, ports, usage and cancel, at the protocol's paths) to one trusted
// caller holding secret as a bearer token: the control plane, which
// checked the run is its tenant's. Every other call is 401.
func (s *Server) LiveHandler(secret string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+PathCancel, s.serveCancel)
	mux.HandleFunc("POST "+PathExec, s.serveExec)
	mux.HandleFunc("POST "+PathProcesses, s.serveProcesses)
	mux.HandleFunc("GET "+PathProcesses, s.serveProcesses)
	mux.HandleFunc("GET "+PathProcess, s.serveProcess)
	mux.HandleFunc("GET "+PathProcessOutput, s.serveProcessOutput)
	mux.HandleFunc("POST "+PathProcessStdin, s.serveProcessStdin)
	mux.HandleFunc("POST "+PathProcessSignal, s.serveProcessSignal)
	mux.HandleFunc("GET "+PathUsage, s.serveUsage)
	mux.HandleFunc(PathFiles, s.serveFiles)
	mux.HandleFunc("GET "+PathPorts, s.servePorts)
	mux.HandleFunc(PathPort, s.servePort)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || secret == "" || subtle.ConstantTimeCompare([]byte(got), []byte(secret)) != 1 {
			refuse(w, http.StatusUnauthorized, errors.New("the live API answers the control plane only"))
			return
		}
		r.Header.Del("Authorization")
		ctx := context.WithValue(r.Context(), peerKey{}, peerResult{peer: Peer{UID: 0}})
		if c := r.Header.Get(CallerHeader); c != "" {
			ctx = context.WithValue(ctx, callerKey{}, c)
		}
		// Neither reaches a declared port's agent.
		r.Header.Del(CallerHeader)
		mux.ServeHTTP(w, r.WithContext(ctx))
	})
}

type callerKey struct{}

// callerFrom is who a LiveHandler call says made it, empty otherwise.
func callerFrom(ctx context.Context) string {
	c, _ := ctx.Value(callerKey{}).(string)
	return c
}

// CheckPorts refuses a port declaration a live run may not make: over
// MaxPorts ports, a duplicate, or one outside 1-65535.
func CheckPorts(ports []int) error { return checkPorts(ports) }
