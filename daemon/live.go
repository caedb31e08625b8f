package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/docker/docker/client"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workerclient"
)

// IdleCommand is a keep-alive run's command when its request names none:
// it idles until the run is stopped.
var IdleCommand = []string{"/bin/sh", "-c", "while :; do sleep 3600; done"}

// maxExecRequest caps an ExecRequest's body.
const maxExecRequest = 1 << 20

// forget drops a run from the live runs.
func (s *Server) forget(runID string) {
	s.mu.Lock()
	delete(s.runs, runID)
	s.mu.Unlock()
}

// runningUpdater logs a run's statuses and sends nil on running (once,
// buffered) when the run is RUNNING.
type runningUpdater struct {
	executor.LogUpdater
	running chan *Result
	live    *liveRun
}

// UpdateRunStatus implements executor.TaskRunUpdater.
func (u runningUpdater) UpdateRunStatus(ctx context.Context, runID string, req *workerclient.PatchTaskRunRequest) error {
	if req.Container != nil && req.Container.ID != "" {
		u.live.container.Store(&req.Container.ID)
	}
	if req.Status == model.StatusRunning {
		// Idle time counts from when the agent runs, not from the request:
		// a slow start is not idleness.
		u.live.touch()
		select {
		case u.running <- nil:
		default:
		}
	}
	return u.LogUpdater.UpdateRunStatus(ctx, runID, req)
}

// runLive runs a keep-alive run (run: Host.Run, or a resume) to its end: cancelled by its client, its
// idle timeout, its run timeout or the daemon's stop. Its output goes to
// its records only.
func (s *Server) runLive(ctx, runCtx context.Context, live *liveRun, spec executor.Spec, log *slog.Logger, running chan *Result,
	run func(context.Context, executor.Spec) (*executor.Outcome, error)) {
	defer s.forget(live.ref.RunID)
	defer live.cancel()
	go s.watchIdle(runCtx, live, log)
	spec.StreamSender = workerclient.NewWriterStreamSender(io.Discard)
	spec.Stderr = io.Discard
	spec.Updater = runningUpdater{LogUpdater: executor.LogUpdater{Log: log}, running: running, live: live}
	spec.Timings = timings.New(nil)
	spec.OnUsage = func(u sandbox.Usage) { live.usage.Store(&u) }
	log.Info("live run started", "max_idle", s.cfg.MaxIdle)
	out, err := run(runCtx, spec)
	var ended model.RunStatus
	if out != nil {
		ended = out.Status
	}
	log.Info("live run ended", "status", ended, "err", err)
	res := &Result{Outcome: out, User: spec.Task.UserID, Store: s.cfg.StoreURL, Error: "the live run ended before its agent ran"}
	if err != nil {
		res.Error = err.Error()
		res.CannotRun = out == nil || (out.ContainerID == "" && out.Status == model.StatusFailed)
	}
	select {
	case running <- res:
	default:
	}
	s.keepWarm(ctx)
}

// watchIdle ends a live run no call touched for its idle timeout
// (MaxIdle unless the run has a shorter one): it calls the run's onIdle,
// else cancels it.
func (s *Server) watchIdle(ctx context.Context, live *liveRun, log *slog.Logger) {
	limit := s.cfg.MaxIdle
	if live.maxIdle > 0 && live.maxIdle < limit {
		limit = live.maxIdle
	}
	tick := time.NewTicker(max(limit/4, 50*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if idle := now.Sub(time.Unix(0, live.used.Load())); idle >= limit {
				log.Info("live run idle", "idle", idle.Round(time.Millisecond), "limit", limit)
				if live.onIdle != nil {
					live.onIdle()
					return
				}
				live.cancel()
				return
			}
		}
	}
}

// liveOf is the peer's live run by the request's id: a run of another uid
// (root sees all) is not found, as one that does not exist.
func (s *Server) liveOf(w http.ResponseWriter, r *http.Request) (*liveRun, Peer, bool) {
	peer, err := peerFrom(r.Context())
	if err != nil {
		refuse(w, http.StatusForbidden, err)
		return nil, peer, false
	}
	id := r.PathValue("id")
	s.mu.Lock()
	run, ok := s.runs[id]
	s.mu.Unlock()
	if !ok || (run.uid != peer.UID && peer.UID != 0) {
		refuse(w, http.StatusNotFound, fmt.Errorf("run %s: no live run of yours by that id", id))
		return nil, peer, false
	}
	run.touch()
	return run, peer, true
}

// dockerClient is the engine client of the process and file endpoints.
func (s *Server) dockerClient() (client.APIClient, error) {
	s.dockerOnce.Do(func() {
		if sandbox.CapabilitiesOf(s.cfg.Host.Backend()).Kind != sandbox.BackendDocker {
			s.dockerErr = errors.New("live runs' commands need the docker backend")
			return
		}
		s.docker, s.dockerErr = client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	})
	return s.docker, s.dockerErr
}

// runEngine is a live run's container on the engine: the client that
// reaches it, its id and the run's container user (uid:gid).
type runEngine struct {
	cli      client.APIClient
	id, user string
}

// engineOf finds the live run's container for a command, a signal, a
// port or a file: the status to refuse with is 501 without the docker
// backend, 409 while the run has no container.
func (s *Server) engineOf(ctx context.Context, run *liveRun) (runEngine, int, error) {
	cli, err := s.dockerClient()
	if err != nil {
		return runEngine{}, http.StatusNotImplemented, err
	}
	recorded := ""
	if id := run.container.Load(); id != nil {
		// A warm container was labelled before this run claimed it.
		recorded = *id
	}
	id, user, err := docker.RunContainer(ctx, cli, run.ref.RunID, run.ref.UserID, recorded)
	if err != nil {
		return runEngine{}, http.StatusConflict, err
	}
	return runEngine{cli: cli, id: id, user: user}, http.StatusOK, nil
}

// PathUsage is a live run's resource usage so far (GET): a
// sandbox.Usage, sampled from its container's cgroup every second. The
// figures at its end are in its record.
const PathUsage = "/v1/runs/{id}/usage"

// serveUsage answers the peer's live run's usage at the last sample; 409
// before the first.
func (s *Server) serveUsage(w http.ResponseWriter, r *http.Request) {
	run, _, ok := s.liveOf(w, r)
	if !ok {
		return
	}
	u := run.usage.Load()
	if u == nil {
		refuse(w, http.StatusConflict, fmt.Errorf("run %s: no sample of its usage yet", run.ref.RunID))
		return
	}
	answerJSON(w, http.StatusOK, u)
}
