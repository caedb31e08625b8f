package daemon

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
)

// forkSource is a run forks start from: the parent's uid, spec and
// request, and the checkpoint or stored home they start from.
type forkSource struct {
	uid  uint32
	spec executor.Spec
	req  RunRequest
	from executor.ForkFrom
}

// serveFork starts the forks a ForkRequest asks for of the peer's run: a
// live run is left running and forked from its home as it is now
// (executor.Host.ForkPoint); a paused one from its checkpoint, its memory
// too where the checkpoint keeps it. Each fork is a live run of its own
// (executor.Host.Fork) under the parent's tenant and policy, rebuilt under
// this daemon's tenants and maxima for a run paused elsewhere.
func (s *Server) serveFork(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	peer, err := peerFrom(r.Context())
	if err != nil {
		refuse(w, http.StatusForbidden, err)
		return
	}
	var fr ForkRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxRequestLine)).Decode(&fr); err != nil {
		refuse(w, http.StatusBadRequest, fmt.Errorf("fork request: %w", err))
		return
	}
	if fr.N < 1 || fr.N > MaxForks {
		refuse(w, http.StatusBadRequest, fmt.Errorf("fork request: n %d: ask for 1 to %d forks", fr.N, MaxForks))
		return
	}
	id := r.PathValue("id")
	src, status, err := s.forkSource(r.Context(), peer, id)
	if err != nil {
		refuse(w, status, err)
		return
	}
	res := ForkResult{}
	for range fr.N {
		res.Forks = append(res.Forks, s.startFork(ctx, src, id, fr.Prompt))
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

// forkSource finds the peer's run id live or paused; another uid's run is
// not found, as one that does not exist.
func (s *Server) forkSource(ctx context.Context, peer Peer, id string) (*forkSource, int, error) {
	notFound := fmt.Errorf("run %s: no live or paused run of yours by that id", id)
	s.mu.Lock()
	run, live := s.runs[id]
	pr, paused := s.paused[id]
	s.mu.Unlock()
	switch {
	case live && (run.uid == peer.UID || peer.UID == 0):
		run.touch()
		from, err := s.cfg.Host.ForkPoint(ctx, id)
		if errors.Is(err, executor.ErrNotLive) {
			return nil, http.StatusConflict, err
		} else if err != nil {
			return nil, http.StatusInternalServerError, err
		}
		return &forkSource{uid: run.uid, spec: run.spec, req: run.req, from: from}, 0, nil
	case live:
		return nil, http.StatusNotFound, notFound
	case paused && (pr.uid == peer.UID || peer.UID == 0):
	case paused:
		return nil, http.StatusNotFound, notFound
	default:
		var status int
		var err error
		if pr, status, err = s.loadPaused(ctx, peer, id); err != nil {
			return nil, status, err
		}
	}
	m := pr.checkpoint
	return &forkSource{uid: pr.uid, spec: pr.spec, req: pr.req, from: executor.ForkFrom{Checkpoint: &m}}, 0, nil
}

// startFork starts one fork of parent from src as a live run and answers
// once it runs or ended first.
func (s *Server) startFork(ctx context.Context, src *forkSource, parent, prompt string) ForkedRun {
	id := forkRunID()
	spec := src.spec
	task := *spec.Task
	if prompt != "" {
		task.Prompt = prompt
	}
	if task.WorkspaceDir != "" {
		if fi, err := os.Stat(task.WorkspaceDir); err != nil || !fi.IsDir() {
			// The parent's staged workspace is gone with its run.
			task.WorkspaceDir = ""
		}
	}
	spec.Task = &task
	spec.Run = &model.TaskRun{ID: id, TaskID: task.ID, ParentRunID: parent, Status: model.StatusRunning}
	req := src.req
	req.RunID, req.Prompt, req.Workspace = id, task.Prompt, false
	log := s.log.With("run", id, "parent", parent, "uid", src.uid, "user", task.UserID)
	tokens, err := portTokens(req.Ports)
	if err != nil {
		return ForkedRun{RunID: id, Result: &Result{Error: err.Error(), CannotRun: true, User: task.UserID, Store: s.cfg.StoreURL}}
	}
	runCtx, cancel := context.WithCancel(ctx)
	lr := &liveRun{uid: src.uid, cancel: cancel, ctx: runCtx, spec: spec, req: req, procs: map[string]*process{}, ref: persist.RunRef{
		UserID: task.UserID, ConversationID: task.ConversationID, TaskID: task.ID, RunID: id},
		ports: tokens, portConns: make(chan struct{}, MaxPortConns)}
	lr.touch()
	s.mu.Lock()
	s.runs[id] = lr
	s.mu.Unlock()
	running := make(chan *Result, 1)
	from := src.from
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.runLive(ctx, runCtx, lr, spec, log, running, func(ctx context.Context, spec executor.Spec) (*executor.Outcome, error) {
			return s.cfg.Host.Fork(ctx, spec, from)
		})
	}()
	return ForkedRun{RunID: id, Result: <-running}
}

// forkRunID returns a sortable, unique run ID for a fork, such as
// f20261129T230812-1a2b3c4d.
func forkRunID() string {
	return "f" + time.Now().UTC().Format("20060102T150405") + "-" + strings.ToLower(rand.Text()[:8])
}
