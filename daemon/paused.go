package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
)

// pausedRequestName is the run object that keeps a run paused through a
// daemon resumable by any daemon with the same store: the request it was
// started with and the uid that started it. The checkpoint itself, with
// its digest, is in the run's index record (runindex.Record.Checkpoint).
const pausedRequestName = "checkpoint/daemon-request.json"

// pausedRequest is the content of pausedRequestName.
type pausedRequest struct {
	UID     uint32     `json:"uid"`
	Request RunRequest `json:"request"`
}

// storePaused stores what a resume of the paused live run needs beside
// its index record.
func (s *Server) storePaused(ctx context.Context, run *liveRun) error {
	req := run.req
	req.Workspace = false // its home is stored as the run's session state
	doc, err := json.Marshal(pausedRequest{UID: run.uid, Request: req})
	if err != nil {
		return fmt.Errorf("daemon: store paused run %s: %w", run.ref.RunID, err)
	}
	if _, err := s.cfg.Host.Store().PutRunFile(ctx, run.ref, pausedRequestName, bytes.NewReader(doc), "application/json"); err != nil {
		return fmt.Errorf("daemon: store paused run %s: %w", run.ref.RunID, err)
	}
	return nil
}

// errNotPaused is a stored run of the peer's that is not PAUSED.
var errNotPaused = errors.New("not PAUSED")

// loadPaused finds the peer's run id PAUSED in the store, paused through
// this daemon before it restarted or through another daemon with the same
// store: its index record names its checkpoint, its stored request
// rebuilds its spec, checked again against this daemon's tenants and
// maxima. Another tenant's or uid's run is not found; the status is the
// HTTP status of a refusal.
func (s *Server) loadPaused(ctx context.Context, peer Peer, id string) (*pausedRun, int, error) {
	notFound := fmt.Errorf("run %s: no paused run of yours by that id", id)
	st := s.cfg.Records
	if st == nil {
		return nil, http.StatusNotFound, notFound
	}
	user := ""
	if peer.UID != 0 {
		tenant, err := s.cfg.Tenant(peer.UID)
		if err != nil {
			return nil, http.StatusForbidden, fmt.Errorf("uid %d has no tenant: %w", peer.UID, err)
		}
		user = tenant
	}
	rec, err := runindex.Find(ctx, st, id, user)
	switch {
	case errors.Is(err, runindex.ErrNotFound):
		return nil, http.StatusNotFound, notFound
	case err != nil:
		return nil, http.StatusInternalServerError, fmt.Errorf("run %s: %w", id, err)
	case rec.Status != model.StatusPaused || rec.Checkpoint == nil:
		return nil, http.StatusConflict, fmt.Errorf("run %s is %s: %w", id, rec.Status, errNotPaused)
	}
	rc, err := st.OpenRunFile(ctx, rec.Ref(), pausedRequestName)
	if err != nil {
		return nil, http.StatusConflict, fmt.Errorf("run %s was not paused through a taskrun daemon: %w", id, err)
	}
	defer rc.Close()
	var pr pausedRequest
	if err := json.NewDecoder(rc).Decode(&pr); err != nil {
		return nil, http.StatusInternalServerError, fmt.Errorf("run %s: its stored request: %w", id, err)
	}
	if pr.UID != peer.UID && peer.UID != 0 {
		return nil, http.StatusNotFound, notFound
	}
	// The spec is built as the run's own uid asked for it, under this
	// daemon's tenants and maxima; it must name the run the record names.
	spec, status, err := s.spec(Peer{UID: pr.UID}, pr.Request)
	if err != nil {
		return nil, status, fmt.Errorf("run %s: resume: %w", id, err)
	}
	if spec.Task.UserID != rec.UserID || spec.Run.ID != rec.RunID || spec.Task.ConversationID != rec.ConversationID || spec.Run.TaskID != rec.TaskID {
		return nil, http.StatusConflict, fmt.Errorf("run %s: its stored request names another run", id)
	}
	return &pausedRun{uid: pr.UID, spec: spec, req: pr.Request, checkpoint: *rec.Checkpoint}, 0, nil
}
