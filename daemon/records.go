package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/spool"
)

// Paths of the stored-run API: what taskrun runs, inspect, logs, cp, diff
// and apply read through the daemon. A peer other than root reads its
// tenant's runs only: another tenant's run is not found, as one that does
// not exist.
const (
	// PathRecords lists records (GET; query user, task, status, limit).
	PathRecords = "/v1/records"
	// PathRecord is one run's record with its execs (GET; query user).
	PathRecord = "/v1/records/{id}"
	// PathRecordLog is a run's output log, or its stderr log with
	// stderr=1; follow=1 follows a run in progress on this daemon's root.
	PathRecordLog = "/v1/records/{id}/log"
	// PathRecordObject is one of a run's stored objects: what=patch,
	// what=changes, or what=file with path=P (as taskrun cp's PATH).
	PathRecordObject = "/v1/records/{id}/object"
)

// Follow pacing of PathRecordLog, as taskrun logs --follow in process.
const (
	followPoll    = 200 * time.Millisecond
	followRecheck = 2 * time.Second
	spoolGoneWait = 10 * time.Second
)

// records is the store the stored-run API reads, or a refusal.
func (s *Server) records(w http.ResponseWriter) (*persist.Store, bool) {
	if s.cfg.Records == nil {
		refuse(w, http.StatusNotImplemented, errors.New("this daemon serves no stored runs"))
		return nil, false
	}
	return s.cfg.Records, true
}

// readerUser is the user whose runs the peer reads: root reads the user it
// asks for (any when empty); any other peer its tenant only.
func (s *Server) readerUser(w http.ResponseWriter, r *http.Request) (string, bool) {
	peer, err := peerFrom(r.Context())
	if err != nil {
		refuse(w, http.StatusForbidden, fmt.Errorf("refused: %w", err))
		return "", false
	}
	asked := r.URL.Query().Get("user")
	if peer.UID == 0 {
		return asked, true
	}
	tenant, err := s.cfg.Tenant(peer.UID)
	if err != nil {
		refuse(w, http.StatusForbidden, fmt.Errorf("uid %d has no tenant: %w", peer.UID, err))
		return "", false
	}
	if asked != "" && asked != tenant {
		refuse(w, http.StatusForbidden, fmt.Errorf("user %q: uid %d reads the runs of tenant %q only: drop --user or pass --user %s", asked, peer.UID, tenant, tenant))
		return "", false
	}
	return tenant, true
}

// storeRefusal answers err from reading a stored run: 404 for what the
// in-process commands call a usage error (no such run or object, an
// ambiguous ID, a bad name), 400 for a bad ID, else 500.
func storeRefusal(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, runindex.ErrNotFound), errors.Is(err, runindex.ErrAmbiguous),
		errors.Is(err, persist.ErrInvalidName), errors.Is(err, runindex.ErrNoObject), errors.Is(err, persist.ErrNotFound):
		refuse(w, http.StatusNotFound, err)
	case errors.Is(err, model.ErrInvalidID):
		refuse(w, http.StatusBadRequest, err)
	default:
		refuse(w, http.StatusInternalServerError, err)
	}
}

// serveRecords lists the peer's records, newest first.
func (s *Server) serveRecords(w http.ResponseWriter, r *http.Request) {
	st, ok := s.records(w)
	if !ok {
		return
	}
	user, ok := s.readerUser(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	f := runindex.Filter{UserID: user, TaskID: q.Get("task"), Status: model.RunStatus(q.Get("status"))}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			refuse(w, http.StatusBadRequest, fmt.Errorf("limit %q: give 0 (all) or more", l))
			return
		}
		f.Limit = n
	}
	recs, err := runindex.List(r.Context(), st, f)
	if err != nil {
		storeRefusal(w, err)
		return
	}
	if recs == nil {
		recs = []runindex.Record{}
	}
	writeJSON(w, recs)
}

// findRecord is the peer's record of the request's run.
func (s *Server) findRecord(w http.ResponseWriter, r *http.Request) (*persist.Store, *runindex.Record, bool) {
	st, ok := s.records(w)
	if !ok {
		return nil, nil, false
	}
	user, ok := s.readerUser(w, r)
	if !ok {
		return nil, nil, false
	}
	rec, err := runindex.Find(r.Context(), st, r.PathValue("id"), user)
	if err != nil {
		storeRefusal(w, err)
		return nil, nil, false
	}
	return st, rec, true
}

// serveRecord answers the peer's record of a run, its execs included.
func (s *Server) serveRecord(w http.ResponseWriter, r *http.Request) {
	st, rec, ok := s.findRecord(w, r)
	if !ok {
		return
	}
	execs, err := runindex.Execs(r.Context(), st, rec)
	if err != nil {
		storeRefusal(w, err)
		return
	}
	rec.Execs = execs
	writeJSON(w, rec)
}

// serveRecordObject streams one stored object of the peer's run.
func (s *Server) serveRecordObject(w http.ResponseWriter, r *http.Request) {
	st, rec, ok := s.findRecord(w, r)
	if !ok {
		return
	}
	var rc io.ReadCloser
	var err error
	switch what := r.URL.Query().Get("what"); what {
	case "patch":
		rc, err = runindex.OpenPatch(r.Context(), st, rec)
	case "changes":
		rc, err = runindex.OpenChanges(r.Context(), st, rec)
	case "file":
		rc, err = runindex.OpenFile(r.Context(), st, rec, r.URL.Query().Get("path"))
	default:
		refuse(w, http.StatusBadRequest, fmt.Errorf("what %q: give patch, changes or file", what))
		return
	}
	if err != nil {
		storeRefusal(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = io.Copy(w, rc)
}

// serveRecordLog streams a run's log: the stored one, or with follow=1
// a run in progress on this daemon's root from its spool, to its end.
func (s *Server) serveRecordLog(w http.ResponseWriter, r *http.Request) {
	st, rec, ok := s.findRecord(w, r)
	if !ok {
		return
	}
	stderr := r.URL.Query().Get("stderr") == "1"
	if r.URL.Query().Get("follow") != "1" || rec.Status != model.StatusRunning {
		s.storedLog(w, r.Context(), st, rec, stderr)
		return
	}
	path, err := executor.SpoolPath(s.cfg.Host.Layout().Paths(), rec.Ref(), stderr)
	if err != nil {
		storeRefusal(w, err)
		return
	}
	ctx := r.Context()
	lastCheck := time.Now()
	done := func() bool {
		if time.Since(lastCheck) < followRecheck {
			return false
		}
		lastCheck = time.Now()
		now, err := runindex.Find(ctx, st, rec.RunID, rec.UserID)
		return err == nil && now.Status.Terminal()
	}
	fw := flushWriter{w: w, rc: http.NewResponseController(w)}
	started := false
	out := writeFunc(func(p []byte) (int, error) {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/octet-stream")
		}
		return fw.Write(p)
	})
	_, err = spool.FollowFile(ctx, path, out, followPoll, done)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !started:
		s.spoolGone(w, ctx, st, rec, stderr)
	case err != nil && !started:
		refuse(w, http.StatusInternalServerError, err)
	}
}

// spoolGone answers a run in progress without a spool under the daemon's
// root: it has just ended (its stored log follows once its record says
// so), or it runs elsewhere.
func (s *Server) spoolGone(w http.ResponseWriter, ctx context.Context, st *persist.Store, rec *runindex.Record, stderr bool) {
	deadline := time.Now().Add(spoolGoneWait)
	for {
		now, err := runindex.Find(ctx, st, rec.RunID, rec.UserID)
		if err != nil {
			storeRefusal(w, err)
			return
		}
		if now.Status.Terminal() {
			s.storedLog(w, ctx, st, now, stderr)
			return
		}
		if time.Now().After(deadline) {
			refuse(w, http.StatusConflict, fmt.Errorf("run %s is in progress, but not on this daemon's root: follow it where it runs, or wait for it to end to print its stored log", rec.RunID))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(followRecheck):
		}
	}
}

// storedLog streams rec's stored log.
func (s *Server) storedLog(w http.ResponseWriter, ctx context.Context, st *persist.Store, rec *runindex.Record, stderr bool) {
	rc, err := runindex.OpenLog(ctx, st, rec, stderr)
	if err != nil {
		storeRefusal(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = io.Copy(w, rc)
}

// flushWriter flushes every write to the client.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// writeFunc is a function as an io.Writer.
type writeFunc func([]byte) (int, error)

func (f writeFunc) Write(p []byte) (int, error) { return f(p) }
