package server

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
)

// The run record routes serve what a worker stored of a run in the shared
// store (serve --store), read through the store's run index, for the run's
// own user only: its index record (GET /v1/runs/{id}/record), its change
// set (/patch, /changes) and one of its files (/files/{path}).

// handleRecord answers the run's index record as JSON, with the commands
// run in its container (as taskrun inspect --json prints it).
func (s *Server) handleRecord(w http.ResponseWriter, r *http.Request) {
	run, rec, ok := s.storedRecord(w, r)
	if !ok {
		return
	}
	execs, err := runindex.Execs(r.Context(), s.cfg.Blobs, rec)
	if err != nil {
		s.recordError(w, r, run, "its commands", err)
		return
	}
	rec.Execs = execs
	writeJSON(w, http.StatusOK, rec)
}

// handleChangesPatch answers the run's changes.patch.
func (s *Server) handleChangesPatch(w http.ResponseWriter, r *http.Request) {
	run, rec, ok := s.storedRecord(w, r)
	if !ok {
		return
	}
	rc, err := runindex.OpenPatch(r.Context(), s.cfg.Blobs, rec)
	s.serveObject(w, r, run, rec, "its patch", rec.Keys.Patch, "text/x-diff; charset=utf-8", rc, err)
}

// handleChanges answers the run's changes.json.
func (s *Server) handleChanges(w http.ResponseWriter, r *http.Request) {
	run, rec, ok := s.storedRecord(w, r)
	if !ok {
		return
	}
	rc, err := runindex.OpenChanges(r.Context(), s.cfg.Blobs, rec)
	s.serveObject(w, r, run, rec, "its change list", rec.Keys.Changes, "application/json", rc, err)
}

// handleFile answers one file of the run, named as taskrun cp names it:
// artifacts/PATH, output/result.md, home/PATH (out of its stored session
// state) or another object the run's record lists. The path is the client's:
// it must be a clean relative path, and anything but home/PATH must be an
// object the record lists as stored, so no other key of the store (another
// run's, another tenant's, the uploaded workspace) can be named.
func (s *Server) handleFile(w http.ResponseWriter, r *http.Request) {
	p := r.PathValue("path")
	if err := persist.ValidateRelPath(p); err != nil {
		writeError(w, http.StatusBadRequest, "path: "+err.Error())
		return
	}
	run, rec, ok := s.storedRecord(w, r)
	if !ok {
		return
	}
	key := ""
	if !strings.HasPrefix(p, runindex.HomePrefix) {
		prefix, err := persist.RunPrefix(rec.Ref())
		if err != nil {
			s.recordError(w, r, run, p, err)
			return
		}
		key = prefix + p
		if !stored(rec, key) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("run %s stored no %s: its record lists what it stored (GET /v1/runs/%s/record)", run.ID, p, run.ID))
			return
		}
	}
	rc, err := runindex.OpenFile(r.Context(), s.cfg.Blobs, rec, p)
	s.serveObject(w, r, run, rec, p, key, "application/octet-stream", rc, err)
}

// stored reports whether the record lists key among its stored objects.
func stored(rec *runindex.Record, key string) bool {
	for _, o := range rec.Stored {
		if o.Key == key {
			return true
		}
	}
	return false
}

// storedRecord finds the request's run, if it is the user's, and its record
// in the shared store's run index; else it has answered.
func (s *Server) storedRecord(w http.ResponseWriter, r *http.Request) (controlplane.Run, *runindex.Record, bool) {
	run, ok := s.ownRun(w, r)
	if !ok {
		return run, nil, false
	}
	if s.cfg.Blobs == nil {
		writeError(w, http.StatusNotFound, "run "+run.ID+" has no stored record here: this control plane has no shared store (serve --store)")
		return run, nil, false
	}
	rec, err := runindex.Find(r.Context(), s.cfg.Blobs, run.ID, run.Task.UserID)
	if err == nil && (rec.ConversationID != run.Task.ConversationID || rec.TaskID != run.Task.ID) {
		s.cfg.Log.Error("the store's record of a run names another task", "run", run.ID, "conversation", rec.ConversationID, "task", rec.TaskID)
		writeError(w, http.StatusBadGateway, "the shared store's record of run "+run.ID+" names another task")
		return run, nil, false
	}
	if err != nil {
		s.recordError(w, r, run, "its record", err)
		return run, nil, false
	}
	return run, rec, true
}

// recordError answers an error reading what the run stored.
func (s *Server) recordError(w http.ResponseWriter, r *http.Request, run controlplane.Run, what string, err error) {
	switch {
	case errors.Is(err, runindex.ErrNotFound):
		msg := "run " + run.ID + " has no stored record yet"
		if !run.Status.Terminal() {
			msg += ": it is " + string(run.Status) + "; its worker stores the record when it ends"
		}
		writeError(w, http.StatusNotFound, msg)
	case errors.Is(err, runindex.ErrNoObject), errors.Is(err, persist.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, fmt.Sprintf("run %s stored no %s", run.ID, what))
	case errors.Is(err, persist.ErrInvalidName):
		writeError(w, http.StatusBadRequest, err.Error())
	case r.Context().Err() != nil:
	default:
		s.cfg.Log.Error("read stored run", "run", run.ID, "what", what, "err", err)
		writeError(w, http.StatusBadGateway, fmt.Sprintf("%s of run %s could not be read from the shared store", what, run.ID))
	}
}

// serveObject streams rc, one of the run's stored objects (key, when it is
// one, gives its size from the record), refusing one over
// Limits.MaxFileBytes before a byte of it is sent.
func (s *Server) serveObject(w http.ResponseWriter, r *http.Request, run controlplane.Run, rec *runindex.Record, what, key, contentType string, rc io.ReadCloser, err error) {
	if err != nil {
		s.recordError(w, r, run, what, err)
		return
	}
	defer rc.Close()
	size := int64(-1)
	if st, ok := rc.(interface{ Stat() (fs.FileInfo, error) }); ok {
		if info, err := st.Stat(); err == nil {
			size = info.Size()
		}
	}
	for _, o := range rec.Stored {
		if key != "" && o.Key == key {
			size = o.Size
		}
	}
	limit := s.cfg.Limits.MaxFileBytes
	if size > limit {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("%s of run %s is %d bytes, over the %d this control plane serves: read it from the shared store", what, run.ID, size, limit))
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "sandbox")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	// A size not known beforehand is still bounded: the answer is cut
	// (and so fails at the client) past the limit.
	n, err := io.Copy(w, io.LimitReader(rc, limit+1))
	if err != nil && r.Context().Err() == nil {
		s.cfg.Log.Warn("serving a stored object ended early", "run", run.ID, "what", what, "err", err)
	}
	if n > limit {
		s.cfg.Log.Warn("stored object over the served limit: answer cut", "run", run.ID, "what", what, "limit", limit)
		panic(http.ErrAbortHandler)
	}
}
