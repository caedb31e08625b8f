package server

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/imageref"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// WorkspaceObject is the run file name an uploaded workspace is stored
// under, in the run's prefix of the shared store.
const WorkspaceObject = "workspace.tar.gz"

// Bounds on a task's fields beyond the prompt.
const (
	maxNameLen   = 256      // model, image, runtime
	maxArgs      = 256      // command arguments and env entries, each
	maxArgBytes  = 16 << 10 // one argument or env entry
	maxEgressLen = 64 << 10
	readChunk    = 256 << 10 // bytes per store read when streaming output
)

// DefaultConversation is the conversation of tasks submitted without one.
const DefaultConversation = "api"

var errWorkspaceTooLarge = errors.New("workspace archive too large")

func newID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func user(r *http.Request) string {
	u, _ := UserFromContext(r.Context())
	return u
}

func (s *Server) handleSubmit(w http.ResponseWriter, r *http.Request) {
	lim := s.cfg.Limits
	defer readDeadline(w, uploadDeadline)()
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var (
		req       controlplane.SubmitRequest
		workspace io.Reader
	)
	switch ct {
	case "application/json":
		body := http.MaxBytesReader(w, r.Body, lim.MaxTaskBytes)
		if err := json.NewDecoder(body).Decode(&req); err != nil {
			s.badBody(w, err, fmt.Sprintf("the task's JSON is over %d bytes", lim.MaxTaskBytes))
			return
		}
	case "multipart/form-data":
		if params["boundary"] == "" {
			writeError(w, http.StatusBadRequest, "multipart body without a boundary")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, lim.MaxTaskBytes+lim.MaxWorkspaceBytes+64<<10)
		mr, err := r.MultipartReader()
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		part, err := mr.NextPart()
		if err != nil || part.FormName() != "task" {
			writeError(w, http.StatusBadRequest, `the first part of the body must be "task", the task's JSON`)
			return
		}
		if err := json.NewDecoder(io.LimitReader(part, lim.MaxTaskBytes)).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, "task: "+err.Error())
			return
		}
		part, err = mr.NextPart()
		switch {
		case errors.Is(err, io.EOF):
		case err != nil:
			s.badBody(w, err, "body too large")
			return
		case part.FormName() != "workspace":
			writeError(w, http.StatusBadRequest, `the second part, if any, must be "workspace", a gzip'd tar`)
			return
		default:
			workspace = part
		}
	default:
		writeError(w, http.StatusUnsupportedMediaType, "send the task as application/json, or as multipart/form-data with parts task and workspace")
		return
	}
	if err := s.checkSubmit(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	counts, err := s.cfg.Store.CountByStatus(r.Context(), user(r))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if counts[model.StatusQueued] >= lim.MaxQueuedPerUser {
		w.Header().Set("Retry-After", "30")
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("you have %d runs queued, the most this control plane holds per user: wait for some to start", counts[model.StatusQueued]))
		return
	}
	t := controlplane.NewTask{
		Task:          model.Task{ID: newID("t"), UserID: user(r), ConversationID: req.ConversationID, Prompt: req.Prompt},
		RunID:         newID("r"),
		SessionID:     req.SessionID,
		PreviousRunID: req.PreviousRunID,
		Spec: controlplane.TaskSpec{Model: req.Model, Image: req.Image, Runtime: req.Runtime, Command: req.Command, Env: req.Env,
			Limits: req.Limits, Egress: req.Egress, Retryable: req.Retryable,
			KeepAlive: req.KeepAlive, IdleTimeoutMillis: req.IdleTimeoutMillis, Ports: req.Ports},
		CreatedAt: s.cfg.Now(),
	}
	if t.SessionID == "" {
		t.SessionID = t.Task.ID
	}
	if workspace != nil {
		if s.cfg.Blobs == nil {
			writeError(w, http.StatusBadRequest, "this control plane has no shared store (serve --store): submit without a workspace")
			return
		}
		ref := model.RunRef{UserID: t.Task.UserID, ConversationID: t.Task.ConversationID, TaskID: t.Task.ID, RunID: t.RunID}
		info, err := s.cfg.Blobs.PutRunFile(r.Context(), ref, WorkspaceObject, &capReader{r: workspace, left: lim.MaxWorkspaceBytes}, "application/gzip")
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.Is(err, errWorkspaceTooLarge) || errors.As(err, &tooBig) {
				writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the workspace archive is over %d bytes", lim.MaxWorkspaceBytes))
				return
			}
			s.cfg.Log.Error("store workspace", "run", t.RunID, "err", err)
			writeError(w, http.StatusBadGateway, "could not store the workspace in the shared store")
			return
		}
		t.Spec.Workspace = &workerclient.StoredObject{Key: info.Key, Size: info.Size, SHA256: info.SHA256}
	}
	run, err := s.cfg.Store.CreateTask(r.Context(), t)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	s.m.tasksSubmitted.Inc()
	s.runs.notify(queueKey)
	s.cfg.Log.Info("task submitted", "task", t.Task.ID, "run", run.ID, "user", t.Task.UserID)
	writeJSON(w, http.StatusCreated, controlplane.SubmitResponse{TaskID: t.Task.ID, RunID: run.ID, Status: string(run.Status), Workspace: t.Spec.Workspace})
}

func (s *Server) badBody(w http.ResponseWriter, err error, tooLarge string) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, tooLarge)
		return
	}
	writeError(w, http.StatusBadRequest, err.Error())
}

// capReader fails with errWorkspaceTooLarge past left bytes.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, errWorkspaceTooLarge
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return 0, errWorkspaceTooLarge
	}
	return n, err
}

// checkSubmit validates and defaults a task.
func (s *Server) checkSubmit(r *http.Request, req *controlplane.SubmitRequest) error {
	lim := s.cfg.Limits
	switch {
	case strings.TrimSpace(req.Prompt) == "":
		return errors.New("prompt: give the agent an instruction")
	case len(req.Prompt) > lim.MaxPromptBytes:
		return fmt.Errorf("prompt: %d bytes, over the limit of %d", len(req.Prompt), lim.MaxPromptBytes)
	case len(req.Model) > maxNameLen || len(req.Image) > maxNameLen || len(req.Runtime) > maxNameLen:
		return fmt.Errorf("model, image and runtime are at most %d characters", maxNameLen)
	case len(req.Command) > maxArgs || len(req.Env) > maxArgs:
		return fmt.Errorf("command and env have at most %d entries", maxArgs)
	case len(req.Egress) > maxEgressLen:
		return fmt.Errorf("egress policy over %d bytes", maxEgressLen)
	}
	for _, a := range append(append([]string{}, req.Command...), req.Env...) {
		if len(a) > maxArgBytes {
			return fmt.Errorf("a command argument or env entry is over %d bytes", maxArgBytes)
		}
	}
	for _, e := range req.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("env entry %q: write NAME=VALUE", e)
		}
	}
	l := req.Limits
	if l.TimeoutMillis < 0 || l.MemoryBytes < 0 || l.CPUs < 0 || l.PIDs < 0 || l.DiskBytes < 0 || l.MaxOutputBytes < 0 || l.MaxTokens < 0 {
		return errors.New("limits cannot be negative")
	}
	if len(req.Egress) > 0 && !json.Valid(req.Egress) {
		return errors.New("egress: not valid JSON")
	}
	if err := checkLive(req); err != nil {
		return err
	}
	// A submission is a tenant's request: its limits within the operator's
	// maxima, its egress only what a tenant may ask for (no credential
	// source of the host, no special address). Each worker checks again.
	if err := s.cfg.RunMaxima.Check(l); err != nil {
		return err
	}
	if _, err := egress.ParseTenantRequest(req.Egress); err != nil {
		return err
	}
	if err := s.runnable(req); err != nil {
		return err
	}
	if req.ConversationID == "" {
		req.ConversationID = DefaultConversation
	}
	if err := model.ValidateID("conversation_id", req.ConversationID); err != nil {
		return err
	}
	if req.SessionID != "" {
		if err := model.ValidateID("session_id", req.SessionID); err != nil {
			return err
		}
	}
	if req.PreviousRunID != "" {
		if err := model.ValidateID("previous_run_id", req.PreviousRunID); err != nil {
			return err
		}
		prev, err := s.cfg.Store.GetRun(r.Context(), req.PreviousRunID)
		if err != nil || prev.Task.UserID != user(r) {
			return fmt.Errorf("previous_run_id %s: no such run of yours", req.PreviousRunID)
		}
	}
	return nil
}

// runnable refuses a task no worker can run, which would otherwise wait
// QUEUED until it expired: an image reference that does not parse, or a
// runtime the workers do not offer. Limits above the operator's maxima are
// refused by Config.RunMaxima.
func (s *Server) runnable(req *controlplane.SubmitRequest) error {
	if req.Image != "" && !isImageID(req.Image) {
		if _, err := imageref.Normalize(req.Image); err != nil {
			return fmt.Errorf("%w: give a reference such as registry.example.com/team/agent:v1 or an image ID sha256:<64 hex>", err)
		}
	}
	if rt := s.cfg.Runtimes; req.Runtime != "" && len(rt) > 0 && !slices.Contains(rt, req.Runtime) {
		return fmt.Errorf("runtime %q: the workers offer %s; ask for one of them or leave runtime empty", req.Runtime, strings.Join(rt, ", "))
	}
	return nil
}

// isImageID reports whether ref is an image ID, sha256:<64 hex>.
func isImageID(ref string) bool {
	hex, ok := strings.CutPrefix(ref, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	for _, c := range hex {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ownRun returns the run if it belongs to the request's user; else it
// answers 404 (another user's run is not even acknowledged).
func (s *Server) ownRun(w http.ResponseWriter, r *http.Request) (controlplane.Run, bool) {
	id, ok := runID(w, r)
	if !ok {
		return controlplane.Run{}, false
	}
	run, err := s.cfg.Store.GetRun(r.Context(), id)
	if err == nil && run.Task.UserID != user(r) {
		err = controlplane.ErrNotFound
	}
	if err != nil {
		s.storeError(w, r, err)
		return controlplane.Run{}, false
	}
	return run, true
}

func (s *Server) handleGetRun(w http.ResponseWriter, r *http.Request) {
	if run, ok := s.ownRun(w, r); ok {
		writeJSON(w, http.StatusOK, run)
	}
}

func (s *Server) handleListRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := controlplane.RunFilter{UserID: user(r), Status: model.RunStatus(strings.ToUpper(q.Get("status"))), Limit: 50}
	switch f.Status {
	case "", model.StatusQueued, model.StatusRunning, model.StatusPaused, model.StatusSucceeded, model.StatusFailed, model.StatusCancelled:
	default:
		writeError(w, http.StatusBadRequest, "status: use QUEUED, RUNNING, PAUSED, SUCCEEDED, FAILED or CANCELLED")
		return
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > s.cfg.Limits.MaxListLimit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit: a number from 1 to %d", s.cfg.Limits.MaxListLimit))
			return
		}
		f.Limit = n
	}
	runs, err := s.cfg.Store.ListRuns(r.Context(), f)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	for i := range runs {
		runs[i].Output, runs[i].Task.Prompt = "", ""
	}
	if runs == nil {
		runs = []controlplane.Run{}
	}
	writeJSON(w, http.StatusOK, controlplane.RunList{Runs: runs})
}

func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) {
	run, ok := s.ownRun(w, r)
	if !ok {
		return
	}
	run, err := s.cfg.Store.Cancel(r.Context(), run.ID, s.cfg.Now())
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	s.runs.notify(run.ID)
	s.cfg.Log.Info("run cancelled by its owner", "run", run.ID, "status", run.Status)
	writeJSON(w, http.StatusOK, run)
}

// handleResume puts the owner's PAUSED run back in the queue for a worker
// to restore from its checkpoint. Of concurrent resumes one wins; the
// others, and a run that is not PAUSED, are answered 409.
func (s *Server) handleResume(w http.ResponseWriter, r *http.Request) {
	run, ok := s.ownRun(w, r)
	if !ok {
		return
	}
	run, err := s.cfg.Store.Resume(r.Context(), run.ID, s.cfg.Now())
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	s.runs.notify(run.ID)
	s.runs.notify(queueKey)
	s.cfg.Log.Info("paused run resumed by its owner: queued", "run", run.ID)
	writeJSON(w, http.StatusOK, run)
}

// handleFork queues forks of the owner's PAUSED or ended run: new runs of
// its task, each naming it as its parent, for workers to start from its
// checkpoint or stored home.
func (s *Server) handleFork(w http.ResponseWriter, r *http.Request) {
	run, ok := s.ownRun(w, r)
	if !ok {
		return
	}
	var req controlplane.ForkRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, int64(s.cfg.Limits.MaxPromptBytes)+1024)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "fork request: "+err.Error())
		return
	}
	if req.N < 1 || req.N > controlplane.MaxForks {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("fork request: n %d: ask for 1 to %d forks", req.N, controlplane.MaxForks))
		return
	}
	counts, err := s.cfg.Store.CountByStatus(r.Context(), user(r))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if counts[model.StatusQueued]+req.N > s.cfg.Limits.MaxQueuedPerUser {
		w.Header().Set("Retry-After", "30")
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("you have %d runs queued; %d more would pass the most this control plane holds per user", counts[model.StatusQueued], req.N))
		return
	}
	ids := make([]string, req.N)
	for i := range ids {
		ids[i] = newID("r")
	}
	runs, err := s.cfg.Store.Fork(r.Context(), run.ID, ids, req.Prompt, s.cfg.Now())
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	s.runs.notify(queueKey)
	s.cfg.Log.Info("run forked by its owner", "run", run.ID, "forks", ids)
	writeJSON(w, http.StatusCreated, controlplane.ForkResponse{Runs: runs})
}

// follow admits one more reader of run id, or returns false at the limits.
func (s *Server) follow(id string) (release func(), ok bool) {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if s.followers[id] >= s.cfg.Limits.MaxFollowersPerRun || s.nFollow >= s.cfg.Limits.MaxFollowers {
		return nil, false
	}
	s.followers[id]++
	s.nFollow++
	return func() {
		s.fmu.Lock()
		defer s.fmu.Unlock()
		s.nFollow--
		if s.followers[id]--; s.followers[id] <= 0 {
			delete(s.followers, id)
		}
	}, true
}

// handleOutput streams a run's output from ?offset= (default 0): what is
// held, then, with ?follow=1, what arrives, until the stream ends or the run
// is over. The body is raw bytes, flushed as they come (chunked).
func (s *Server) handleOutput(w http.ResponseWriter, r *http.Request) {
	run, ok := s.ownRun(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	var offset int64
	if v := q.Get("offset"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "offset: a byte offset, 0 or more")
			return
		}
		offset = n
	}
	follow := q.Get("follow") == "1" || q.Get("follow") == "true"
	release, ok := s.follow(run.ID)
	if !ok {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusTooManyRequests, "too many readers of this run's output: try again later")
		return
	}
	defer release()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set(controlplane.HeaderOutputOffset, strconv.FormatInt(offset, 10))
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush() // the headers now: a follower learns at once it is admitted
	}
	for {
		woken := s.runs.wait(run.ID)
		data, cur, err := s.cfg.Store.ReadOutput(r.Context(), run.ID, offset, readChunk)
		if err != nil {
			if r.Context().Err() == nil {
				s.cfg.Log.Error("read output", "run", run.ID, "err", err)
			}
			return
		}
		if len(data) > 0 {
			if _, err := w.Write(data); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
			offset += int64(len(data))
			s.m.bytesSent.Add(float64(len(data)))
			continue
		}
		done := cur.StreamEnded && offset >= cur.StreamNext
		if done || !follow || (cur.Status.Terminal() && offset >= cur.StreamNext && cur.Status != model.StatusSucceeded) {
			return
		}
		if cur.Status.Terminal() && cur.EndedAt != nil && s.cfg.Now().Sub(*cur.EndedAt) > streamGrace {
			return // ended without ending its stream (lost worker): nothing more will come
		}
		poll := time.NewTimer(s.cfg.PollInterval)
		select {
		case <-r.Context().Done():
			poll.Stop()
			return
		case <-woken:
		case <-poll.C:
		}
		poll.Stop()
	}
}

// streamGrace is how long a follower of a finished run whose stream has not
// ended waits for the stream's tail.
const streamGrace = 30 * time.Second

// handleWorkers lists the workers heard from within
// controlplane.WorkerListWindow: their capacity, labels and heartbeat, with
// no run of any tenant.
func (s *Server) handleWorkers(w http.ResponseWriter, r *http.Request) {
	ws, err := s.cfg.Store.ListWorkers(r.Context(), s.cfg.Now().Add(-controlplane.WorkerListWindow))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if ws == nil {
		ws = []controlplane.Worker{}
	}
	writeJSON(w, http.StatusOK, controlplane.WorkerList{Workers: ws})
}
