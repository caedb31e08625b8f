// Package journal keeps one record per run on the host, with everything a
// later process needs to finish the run if its executor dies: the run's
// identity, the executor instance, the container, the host paths (run dir,
// spools, disk-cap image), the store and the control plane, and how far the
// run got.
//
// Every write is atomic: the record goes to a temporary file in the journal
// directory, is fsync'd, renamed over the old record and the directory is
// fsync'd. A reader therefore sees the old record or the new one, never a
// half-written or empty file, whether the writer is killed mid-write or the
// disk fills up (the write then fails with ENOSPC and the old record stays).
//
// Creating a run's record is exclusive: it takes the run's lock file
// (flock, held by the executor for the whole run) and links the new record in
// place with link(2), which fails if a record exists. Two runs started at
// once with the same run ID: the second gets ErrExists and touches nothing of
// the first.
package journal

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/model"
)

// Version is the record format written by this package. Version 2 added
// Judged; a Version 1 record of a judged run has no Judged, and the
// executor kept what Judged holds in a file of its own beside the spools.
const Version = 2

// File names in a journal directory.
const (
	recordSuffix = ".json"
	lockSuffix   = ".lock"
	tempPrefix   = ".tmp-"
)

// staleTemp is how old a temporary file must be before List removes it (a
// writer killed mid-write leaves one behind).
const staleTemp = time.Minute

// ErrExists is wrapped by Create when the run ID already has a record or a
// live run holds its lock.
var ErrExists = errors.New("run ID is already in use on this host")

// ErrNotFound is wrapped when a run has no record.
var ErrNotFound = errors.New("run has no journal record")

// ErrBusy is wrapped by Claim when the run's executor (or another recovery)
// still holds the run's lock.
var ErrBusy = errors.New("run is held by a live process")

// Phase is how far a run got.
type Phase string

// The phases a record moves through. A record that outlives its executor in
// any phase but PhaseKept is recovered by `taskrun gc`; a PhaseKept record
// waits for `taskrun persist` (or a worker's retry).
const (
	// PhasePrepare: the run dir (and its disk cap) is being created.
	PhasePrepare Phase = "prepare"
	// PhaseSupervise: the container was created (ContainerID is set).
	PhaseSupervise Phase = "supervise"
	// PhaseCollect: the container ended; outputs are being stored.
	PhaseCollect Phase = "collect"
	// PhaseReport: everything was stored; the final status is being sent.
	PhaseReport Phase = "report"
	// PhaseKept: storing failed; the local copy is kept for a retry and
	// holds no loop mount. Reason says why.
	PhaseKept Phase = "kept"
)

// Pending names a step that was not done when the record was written.
type Pending string

// Steps a record can leave for recovery.
const (
	PendingContainer Pending = "remove-container"
	PendingPersist   Pending = "persist"
	PendingReport    Pending = "report"
	PendingRelease   Pending = "release"
)

// DiskCap is the run dir's loop-mounted filesystem, if any.
type DiskCap struct {
	// Image is the filesystem image file.
	Image string `json:"image"`
	// Mount is where it is (or was) mounted: the run dir.
	Mount string `json:"mount"`
	// Mounted is false once it was unmounted (a kept run holds no mount).
	Mounted bool `json:"mounted"`
}

// ControlPlane says where the run's status goes and how the token is found
// again. The worker's token itself is never journaled.
type ControlPlane struct {
	// URL is the control plane's base URL, without credentials.
	URL string `json:"url"`
	// TokenEnv names the environment variable the token was read from.
	TokenEnv string `json:"token_env,omitempty"`
	// TokenFile names the file the token was read from.
	TokenFile string `json:"token_file,omitempty"`
	// Fence is the epoch of the lease a worker held on the run (0: the run
	// was not leased), and LeaseToken that lease's token. Recovery renews
	// the lease and reports with them, so that a control plane that has
	// ended the run or given it to another worker since refuses both the
	// run's store writes and its report. The lease token is journaled (the
	// worker's credential never is): it is good only for this run's current
	// lease, and only with the credential of the worker it was handed to.
	Fence      int64  `json:"fence,omitempty"`
	LeaseToken string `json:"lease_token,omitempty"`
}

// Record is one run's journal entry.
type Record struct {
	Version int `json:"version"`
	// RunID, UserID, ConversationID, TaskID and SessionID identify the run.
	RunID          string `json:"run_id"`
	UserID         string `json:"user_id"`
	ConversationID string `json:"conversation_id"`
	TaskID         string `json:"task_id"`
	SessionID      string `json:"session_id"`
	PreviousRunID  string `json:"previous_run_id,omitempty"`
	// ParentRunID names the run this one was forked from.
	ParentRunID string `json:"parent_run_id,omitempty"`
	// Executor is the executor instance that runs (or ran) the run.
	Executor instance.Info `json:"executor"`
	// ContainerID is the run's container, once created.
	ContainerID string `json:"container_id,omitempty"`
	// RunDir is the run directory (bind-mounted at /taskrun).
	RunDir string `json:"run_dir"`
	// SpoolDir is the executor's private directory (output spools, records).
	SpoolDir string `json:"spool_dir"`
	// PoolSlot names the warm pool slot whose container and directory the
	// run took over (package warmpool); RunDir and SpoolDir are then the
	// slot's, not the runs root layout's.
	PoolSlot string `json:"pool_slot,omitempty"`
	// DiskCap is the run dir's capped filesystem, when one was mounted.
	DiskCap *DiskCap `json:"disk_cap,omitempty"`
	// Store is the blob store URL, without credentials.
	Store string `json:"store"`
	// ControlPlane is set when a control plane receives the run's status.
	ControlPlane *ControlPlane `json:"control_plane,omitempty"`
	// KeepRunDir, SessionExcludes and MaxOutputBytes shape collection.
	KeepRunDir      bool     `json:"keep_run_dir,omitempty"`
	SessionExcludes []string `json:"session_excludes,omitempty"`
	MaxOutputBytes  int64    `json:"max_output_bytes,omitempty"`
	// Timeout is the run's timeout.
	Timeout time.Duration `json:"timeout,omitempty"`
	// Phase is how far the run got.
	Phase Phase `json:"phase"`
	// Status and Reason are the verdict once known.
	Status model.RunStatus `json:"status,omitempty"`
	Reason string          `json:"reason,omitempty"`
	// Judged is how the run ended, as judged before anything was stored;
	// nil until then.
	Judged *Judged `json:"judged,omitempty"`
	// Pending lists the steps left for recovery.
	Pending []Pending `json:"pending,omitempty"`
	// StartedAt and UpdatedAt are when the run started and the record was
	// last written.
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Judged is a run's verdict and what its executor observed of it, as they
// stood before anything was stored: a retry or a recovery reports them as
// the run would have. Status and Reason of the Record change later (a kept
// run's reason names the failed upload); Judged does not.
type Judged struct {
	// Status and Reason are the verdict; RunError is the run's own error,
	// if any.
	Status   model.RunStatus `json:"status"`
	Reason   string          `json:"reason,omitempty"`
	RunError string          `json:"run_error,omitempty"`
	// EndedAt is when the verdict was reached.
	EndedAt time.Time `json:"ended_at"`
	// Execution is the executor's account of the container (exit, runtime,
	// image digest, tokens, usage...), in the executor's own format.
	Execution json.RawMessage `json:"execution,omitempty"`
}

// validate checks what a record needs to be written and found again.
func (r *Record) validate() error {
	return errors.Join(
		model.ValidateID("run", r.RunID),
		model.ValidateID("user", r.UserID),
		model.ValidateID("conversation", r.ConversationID),
		model.ValidateID("task", r.TaskID),
	)
}

// Dir is a journal directory.
type Dir struct {
	path string
	now  func() time.Time
}

// Open returns the journal in dir, created 0700 if missing.
func Open(dir string) (*Dir, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("journal: create %s: %w", dir, err)
	}
	return &Dir{path: dir, now: time.Now}, nil
}

// Path returns the journal directory.
func (d *Dir) Path() string { return d.path }

func (d *Dir) recordPath(runID string) string { return filepath.Join(d.path, runID+recordSuffix) }
func (d *Dir) lockPath(runID string) string   { return filepath.Join(d.path, runID+lockSuffix) }

// Entry is a run's record held by the process that owns the run: it holds
// the run's lock until Close or Remove.
type Entry struct {
	d    *Dir
	lock *instance.Lock
	mu   sync.Mutex
	rec  Record
}

// Create journals a new run exclusively. It fails with ErrExists, touching
// nothing, when the run ID has a record already (a live run, a kept run, or
// one left by a dead executor that `taskrun gc` has not recovered yet) or
// when another process holds the run's lock.
func (d *Dir) Create(rec Record) (*Entry, error) {
	if err := rec.validate(); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	lock, err := instance.TryLock(d.lockPath(rec.RunID))
	if errors.Is(err, instance.ErrLocked) {
		return nil, fmt.Errorf("journal: run %s: %w: another run with this ID is in progress; pick another run ID", rec.RunID, ErrExists)
	}
	if err != nil {
		return nil, fmt.Errorf("journal: lock run %s: %w", rec.RunID, err)
	}
	if old, err := d.Load(rec.RunID); err == nil {
		lock.Unlock(false)
		return nil, fmt.Errorf("journal: run %s: %w: %s", rec.RunID, ErrExists, old.describe())
	}
	rec.Version = Version
	now := d.now().UTC()
	if rec.StartedAt.IsZero() {
		rec.StartedAt = now
	}
	rec.UpdatedAt = now
	if err := d.write(rec, true); err != nil {
		lock.Unlock(false)
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("journal: run %s: %w", rec.RunID, ErrExists)
		}
		return nil, err
	}
	return &Entry{d: d, lock: lock, rec: rec}, nil
}

// describe says what a record left behind is, for ErrExists messages.
func (r *Record) describe() string {
	switch r.Phase {
	case PhaseKept:
		return fmt.Sprintf("it was kept on this host after %q; `taskrun persist --run-id %s` finishes it, or pick another run ID", r.Reason, r.RunID)
	default:
		return fmt.Sprintf("it is in phase %s under executor %s (pid %d); if that executor is gone, `taskrun gc` recovers it; or pick another run ID", r.Phase, r.Executor.ID, r.Executor.PID)
	}
}

// Claim takes over the record of a run whose owner is gone (its lock is
// free), for recovery or a persist retry. It fails with ErrBusy while a live
// process holds the run, and with ErrNotFound when there is no record.
func (d *Dir) Claim(runID string) (*Entry, error) {
	if err := model.ValidateID("run", runID); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	lock, err := instance.TryLock(d.lockPath(runID))
	if errors.Is(err, instance.ErrLocked) {
		return nil, fmt.Errorf("journal: run %s: %w", runID, ErrBusy)
	}
	if err != nil {
		return nil, fmt.Errorf("journal: lock run %s: %w", runID, err)
	}
	rec, err := d.Load(runID)
	if err != nil {
		lock.Unlock(true)
		return nil, err
	}
	return &Entry{d: d, lock: lock, rec: *rec}, nil
}

// Held reports whether a live process holds the run's lock.
func (d *Dir) Held(runID string) (bool, error) {
	held, err := instance.Held(d.lockPath(runID))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return held, err
}

// Load reads a run's record.
func (d *Dir) Load(runID string) (*Record, error) {
	if err := model.ValidateID("run", runID); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	data, err := os.ReadFile(d.recordPath(runID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("journal: run %s: %w", runID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("journal: record %s is not valid JSON: %w", d.recordPath(runID), err)
	}
	if rec.RunID != runID {
		return nil, fmt.Errorf("journal: record %s names run %q", d.recordPath(runID), rec.RunID)
	}
	return &rec, nil
}

// List returns every record in the journal, in run ID order, with an error
// for each file that could not be read. It removes temporary files older
// than a minute (left by a writer killed mid-write) and the lock files of
// runs without a record that no process holds (left by an executor killed
// between locking a new run and journaling it).
func (d *Dir) List() ([]*Record, error) {
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	var recs []*Record
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, tempPrefix) {
			if info, err := e.Info(); err == nil && d.now().Sub(info.ModTime()) > staleTemp {
				_ = os.Remove(filepath.Join(d.path, name))
			}
			continue
		}
		if runID, ok := strings.CutSuffix(name, lockSuffix); ok {
			d.removeOrphanLock(runID)
			continue
		}
		runID, ok := strings.CutSuffix(name, recordSuffix)
		if !ok || model.ValidateID("run", runID) != nil {
			continue
		}
		rec, err := d.Load(runID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recs = append(recs, rec)
	}
	slices.SortFunc(recs, func(a, b *Record) int { return strings.Compare(a.RunID, b.RunID) })
	return recs, errors.Join(errs...)
}

// removeOrphanLock removes runID's lock file when the run has no record and
// no process holds the lock. Only Create writes a new record, holding the
// lock; a record found once the lock is taken keeps its lock file.
func (d *Dir) removeOrphanLock(runID string) {
	if model.ValidateID("run", runID) != nil {
		return
	}
	if _, err := os.Lstat(d.recordPath(runID)); !errors.Is(err, fs.ErrNotExist) {
		return
	}
	lock, err := instance.TryLock(d.lockPath(runID))
	if err != nil {
		return // held: the run is being created, or is live
	}
	_, err = os.Lstat(d.recordPath(runID))
	_ = lock.Unlock(errors.Is(err, fs.ErrNotExist))
}

// Record returns a copy of the entry's current record.
func (e *Entry) Record() Record {
	e.mu.Lock()
	defer e.mu.Unlock()
	rec := e.rec
	rec.Pending = slices.Clone(rec.Pending)
	if rec.Judged != nil {
		j := *rec.Judged
		j.Execution = slices.Clone(j.Execution)
		rec.Judged = &j
	}
	return rec
}

// Update applies change to the record and writes it atomically. When the
// write fails (ENOSPC, EIO) the journal keeps the previous record, the entry
// keeps the change in memory (a later Update writes it) and the error, which
// wraps the system's, is returned.
func (e *Entry) Update(change func(*Record)) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lock == nil {
		return fmt.Errorf("journal: run %s: update after close", e.rec.RunID)
	}
	change(&e.rec)
	e.rec.UpdatedAt = e.d.now().UTC()
	return e.d.write(e.rec, false)
}

// Remove deletes the record (the run is finished) and releases the lock.
func (e *Entry) Remove() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lock == nil {
		return nil
	}
	err := os.Remove(e.d.recordPath(e.rec.RunID))
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if err == nil {
		err = syncDir(e.d.path)
	}
	if err != nil {
		return fmt.Errorf("journal: remove run %s: %w", e.rec.RunID, err)
	}
	uerr := e.lock.Unlock(true)
	e.lock = nil
	return uerr
}

// Close releases the run's lock and keeps the record: the run is left for
// recovery or a persist retry.
func (e *Entry) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lock == nil {
		return nil
	}
	err := e.lock.Unlock(false)
	e.lock = nil
	return err
}

// write stores rec atomically; with exclusive it fails with fs.ErrExist when
// a record exists.
func (d *Dir) write(rec Record, exclusive bool) (err error) {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("journal: encode run %s: %w", rec.RunID, err)
	}
	data = append(data, '\n')
	tmp := filepath.Join(d.path, tempPrefix+rec.RunID+"-"+strings.ToLower(rand.Text()[:8]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("journal: write run %s: %w", rec.RunID, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("journal: write run %s: %w", rec.RunID, noSpace(err, d.path))
	}
	final := d.recordPath(rec.RunID)
	if exclusive {
		if err = os.Link(tmp, final); err != nil {
			return fmt.Errorf("journal: write run %s: %w", rec.RunID, err)
		}
		_ = os.Remove(tmp)
	} else if err = os.Rename(tmp, final); err != nil {
		return fmt.Errorf("journal: write run %s: %w", rec.RunID, noSpace(err, d.path))
	}
	if err := syncDir(d.path); err != nil {
		return fmt.Errorf("journal: write run %s: %w", rec.RunID, err)
	}
	return nil
}

// noSpace names the full filesystem in an ENOSPC error.
func noSpace(err error, dir string) error {
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("the filesystem of %s is full (the previous record is intact): %w", dir, err)
	}
	return err
}

// syncDir fsyncs a directory so a rename or unlink in it is durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// RedactURL returns rawURL without user info and without query parameters
// that look like credentials, for journaling a store or control-plane URL.
func RedactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	u.User = nil
	q := u.Query()
	for k := range q {
		l := strings.ToLower(k)
		if slices.ContainsFunc(secretParams, func(s string) bool { return strings.Contains(l, s) }) {
			q.Del(k)
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// secretParams are substrings of URL query parameter names that carry
// credentials; RedactURL drops such parameters.
var secretParams = []string{"secret", "token", "password", "passwd", "signature", "credential", "access_key", "accesskey", "account_key", "sas"}

// WriteFileAtomic writes data to path as the journal writes records: to a
// temporary file beside it, fsync'd, renamed over path, with the directory
// fsync'd. A reader sees the old file or the new one, never a partial or
// empty one; on error (ENOSPC included) the old file is intact.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tempPrefix+filepath.Base(path)+"-")
	if err != nil {
		return noSpace(err, dir)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	return noSpace(err, dir)
}
