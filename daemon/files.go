package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// PathFiles is the file API of a live run: GET reads (op=read, the
// default), lists (op=list), stats (op=stat) or watches (op=watch, see
// WatchEvent) the path query parameter, PUT writes it, DELETE removes it;
// paths are under the run's home.
const PathFiles = "/v1/runs/{id}/files"

// MaxFileBytes bounds a file read or written through the file API, and
// MaxListEntries a listing.
const (
	MaxFileBytes   = 16 << 20
	MaxListEntries = 10000
)

// FileInfo is a path's kind, size, mode and time.
type FileInfo struct {
	Name    string    `json:"name"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	Dir     bool      `json:"dir,omitempty"`
	Symlink bool      `json:"symlink,omitempty"`
	ModTime time.Time `json:"mod_time"`
}

func fileInfo(fi fs.FileInfo) FileInfo {
	return FileInfo{Name: fi.Name(), Size: fi.Size(), Mode: fi.Mode().String(), Dir: fi.IsDir(),
		Symlink: fi.Mode()&fs.ModeSymlink != 0, ModTime: fi.ModTime().UTC()}
}

// serveFiles serves the file API on the peer's live run. Every path is
// opened through an os.Root on the run's home: a path or a symlink (the
// agent's own) that leads out of it is refused.
func (s *Server) serveFiles(w http.ResponseWriter, r *http.Request) {
	run, _, ok := s.liveOf(w, r)
	if !ok {
		return
	}
	name := strings.TrimPrefix(r.URL.Query().Get("path"), "/")
	if name == "" {
		name = "."
	}
	ref := run.ref
	home := s.cfg.Host.Layout().Paths().RuntimeTaskRunHomeDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID)
	root, err := os.OpenRoot(home)
	if err != nil {
		refuse(w, http.StatusConflict, fmt.Errorf("run %s: its home is not there: %w", ref.RunID, err))
		return
	}
	defer root.Close()
	switch {
	case r.Method == http.MethodGet && r.URL.Query().Get("op") == "watch":
		s.serveWatch(w, r, run, root, name)
	case r.Method == http.MethodGet && r.URL.Query().Get("op") == "stat":
		fi, err := root.Lstat(name)
		if err != nil {
			fileError(w, err)
			return
		}
		writeJSON(w, fileInfo(fi))
	case r.Method == http.MethodGet && r.URL.Query().Get("op") == "list":
		f, err := root.Open(name)
		if err != nil {
			fileError(w, err)
			return
		}
		defer f.Close()
		ents, err := f.ReadDir(MaxListEntries + 1)
		if err != nil && !errors.Is(err, io.EOF) {
			fileError(w, err)
			return
		}
		if len(ents) > MaxListEntries {
			refuse(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%s: over %d entries", name, MaxListEntries))
			return
		}
		list := make([]FileInfo, 0, len(ents))
		for _, e := range ents {
			if fi, err := e.Info(); err == nil {
				list = append(list, fileInfo(fi))
			}
		}
		writeJSON(w, list)
	case r.Method == http.MethodGet:
		f, err := root.Open(name)
		if err != nil {
			fileError(w, err)
			return
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			fileError(w, err)
			return
		}
		if !fi.Mode().IsRegular() {
			refuse(w, http.StatusBadRequest, fmt.Errorf("%s is not a regular file", name))
			return
		}
		if fi.Size() > MaxFileBytes {
			refuse(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%s: %d bytes, over %d", name, fi.Size(), MaxFileBytes))
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		_, _ = io.Copy(w, io.LimitReader(f, MaxFileBytes))
	case r.Method == http.MethodPut:
		uid, gid, err := s.runOwner(r, run)
		if err != nil {
			refuse(w, http.StatusConflict, err)
			return
		}
		data, err := io.ReadAll(io.LimitReader(r.Body, MaxFileBytes+1))
		if err != nil {
			refuse(w, http.StatusBadRequest, err)
			return
		}
		if len(data) > MaxFileBytes {
			refuse(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%s: over %d bytes", name, MaxFileBytes))
			return
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			fileError(w, err)
			return
		}
		_, err = f.Write(data)
		if err == nil {
			// The run's user owns what it was given.
			err = f.Chown(uid, gid)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			fileError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodDelete:
		if err := root.Remove(name); err != nil {
			fileError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		refuse(w, http.StatusMethodNotAllowed, fmt.Errorf("%s: GET, PUT or DELETE", r.Method))
	}
}

// runOwner is the uid and gid of the run's container user.
func (s *Server) runOwner(r *http.Request, run *liveRun) (int, int, error) {
	eng, _, err := s.engineOf(r.Context(), run)
	if err != nil {
		return 0, 0, err
	}
	u, g, _ := strings.Cut(eng.user, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("run %s: its container user %q is not uid:gid", run.ref.RunID, eng.user)
	}
	return uid, gid, nil
}

// fileError answers a failed file operation: 404 for a missing path, 400
// for one that leads out of the run's home, else 409.
func fileError(w http.ResponseWriter, err error) {
	var pe *fs.PathError
	msg := err
	if errors.As(err, &pe) {
		// The error names the daemon's host path: say only the run's.
		msg = fmt.Errorf("%s %s: %w", pe.Op, pe.Path, pe.Err)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		refuse(w, http.StatusNotFound, msg)
	case strings.Contains(err.Error(), "escapes") || strings.Contains(err.Error(), "path escapes"):
		refuse(w, http.StatusBadRequest, msg)
	default:
		refuse(w, http.StatusConflict, msg)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
