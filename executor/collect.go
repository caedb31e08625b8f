package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/timings"
)

// Names of a run's own objects in PersistStorage.
const (
	OutputLogName    = "output.log"
	StderrLogName    = "stderr.log"
	SessionStateName = "state.tar.gz"
	ResultPrefix     = "output/"
	// AuditRecordName is the run object holding the isolation record; the
	// executor keeps it under the same name until it is stored.
	AuditRecordName = "audit.json"
	// CollectionRecordName is the run object listing what collection left
	// out of the run's files, with the reasons, and what the run's host
	// records dropped (see CollectionRecord).
	CollectionRecordName = "collection.json"
)

// maxIsolationRecordBytes is the room of the run's record budget set aside
// for its isolation record; a record is far smaller.
const maxIsolationRecordBytes = 1 << 20

// Executor-private files in the run's host directory (plan.hostDir).
const (
	stdoutSpoolName = "stdout.log"
	stderrSpoolName = "stderr.log"
	// legacyKeptName held what RetryPersist needs (see keptrun.go) for a
	// run journaled with a Version 1 record; the record holds it since.
	legacyKeptName = "run.json"
)

// Caps on what is collected from the run directory. The agent is untrusted;
// anything over a cap is skipped and recorded, never silently truncated.
// Across the whole run, collection reads at most the disk cap (see
// limits.collect), by allocated size, a hard-linked file once.
const (
	maxCollectFileBytes  = 1 << 30
	maxCollectTotalBytes = 4 << 30
)

// Run directories a skipped file can come from (SkippedFile.Root).
const (
	rootArtifacts = "artifacts"
	rootOutput    = "output"
	rootGlobal    = "global"
	rootHome      = "home"
)

// SkippedFile is a file of the agent's that the run did not store.
type SkippedFile struct {
	// Root is the run directory it is in: "artifacts", "output", "global"
	// or "home" (session state).
	Root string `json:"root"`
	// Path is relative to Root, as the agent named it.
	Path string `json:"path"`
	// Reason says why it was not stored.
	Reason string `json:"reason"`
}

// CollectionRecord is the run object CollectionRecordName: what the
// executor left out of the run's files and records, and why.
type CollectionRecord struct {
	// Skipped lists the first workspace.MaxSkips files not stored;
	// DroppedSkips counts the others.
	Skipped      []SkippedFile `json:"skipped"`
	DroppedSkips int64         `json:"dropped_skips,omitempty"`
	// ReadBytes is what collection read of the run's files, of at most
	// ReadLimitBytes.
	ReadBytes      int64 `json:"read_bytes"`
	ReadLimitBytes int64 `json:"read_limit_bytes"`
	// DroppedRecordBytes counts bytes of the host-side records refused by
	// the run's record budget of RecordBudgetBytes.
	DroppedRecordBytes int64 `json:"dropped_record_bytes,omitempty"`
	RecordBudgetBytes  int64 `json:"record_budget_bytes"`
}

// stored is what collect put into blob storage.
type stored struct {
	// objects lists every object stored; artifacts the artifacts among
	// them, in path order.
	objects   []persist.ObjectInfo
	artifacts []persist.ObjectInfo
	// output is the head of the stdout log, capped at MaxResultOutputBytes.
	output []byte
	// tracePath is set when the agent wrote this run's trace.
	tracePath string
	// artifactsDir is the host directory the artifacts were collected from.
	artifactsDir string
	// changes is the stored change set; nil when the run has none.
	changes *changeResult
	// skipped lists the agent's files not stored (the first
	// workspace.MaxSkips); droppedSkips counts the others.
	skipped      []SkippedFile
	droppedSkips int64
}

// keepAndCollect keeps the run's local copy (keepLocalState; the verdict
// and execution were journaled when the run was judged), then collects it
// (collect): the local copy comes before any upload, so a failed upload
// can be retried by RetryPersist. It matters only then: a full host disk
// that refuses it, or refused the judged journal write, fails the persist
// only together with an upload.
func (r *runner) keepAndCollect(ctx context.Context, ex execution, v verdict) (stored, error) {
	if ex.ContainerID == "" {
		return stored{}, nil // the agent never ran: there is nothing of it to keep
	}
	p := r.p
	r.tr.step("keep")
	stopLocal := p.timings.Start(timings.KeepLocal)
	localErr := errors.Join(r.judgedErr, keepLocalState(p, r.wd, ex))
	stopLocal()
	st, err := r.collect(ctx, ex, v)
	if localErr != nil && err == nil {
		p.log.Warn("could not keep a local copy of the run's outcome; everything was stored", "err", localErr)
	} else if localErr != nil {
		err = errors.Join(err, fmt.Errorf("persist local copy: %w", localErr))
	}
	if err != nil {
		p.log.Error("persist failed; the run directory is kept for a retry", "dir", p.dirs.Dir, "err", err)
	}
	return st, err
}

// collect stores whatever the run produced, even after a failure: the
// Collect hooks store the executor's records (output logs, change set,
// gateway and egress records, isolation record) while the beside hooks
// store the agent's files; then the Seal hooks store what covers them all.
// Each step runs regardless of the others; their errors are joined.
func (r *runner) collect(ctx context.Context, ex execution, v verdict) (stored, error) {
	p := r.p
	c := &collector{p: p}
	defer p.timings.Start(timings.Persist)()
	req := &collectRequest{Kept: c.kept, Global: c.global, Put: c.put, Stored: c.stored}
	var records, files persistSteps
	recResp, filesResp := r.collectEvents(ctx, req, &sealRequest{Objects: c.objects, Exec: ex, Verdict: v}, &records, &files)
	c.out.changes, c.out.output = recResp.Changes, recResp.Output
	c.out.artifacts, c.out.artifactsDir, c.out.tracePath = filesResp.Artifacts, filesResp.ArtifactsDir, filesResp.TracePath
	c.out.skipped, c.out.droppedSkips = filesResp.Skipped, filesResp.DroppedSkips
	slices.SortFunc(c.out.objects, func(a, b persist.ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return c.out, errors.Join(append(records.errs, files.errs...)...)
}

// persistSteps gathers the errors of a sequence of collect steps.
type persistSteps struct{ errs []error }

// do records the error of the step storing what.
func (s *persistSteps) do(err error, what string) {
	if err != nil {
		s.errs = append(s.errs, fmt.Errorf("persist %s: %w", what, err))
	}
}

// collector accumulates one collect call's result. The executor's records
// and the agent's files are stored concurrently (see collect): mu guards
// out.objects.
type collector struct {
	p   *plan
	mu  sync.Mutex
	out stored
}

// objects is a copy of the objects stored so far.
func (c *collector) objects() []persist.ObjectInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.out.objects)
}

// kept uploads the executor-private file name as the run object objectName;
// a file that does not exist is skipped.
func (c *collector) kept(ctx context.Context, name, objectName, contentType string) error {
	f, err := os.Open(filepath.Join(c.p.hostDir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return c.stored(c.p.in.Persist.PutRunFile(ctx, c.p.ref, objectName, f, contentType))
}

// put stores r as the run object name and records it.
func (c *collector) put(ctx context.Context, name string, r io.Reader, contentType string) (persist.ObjectInfo, error) {
	info, err := c.p.in.Persist.PutRunFile(ctx, c.p.ref, name, r, contentType)
	return info, c.stored(info, err)
}

// readHead returns the first limit bytes of the file at path, with
// TruncationMarker when it was longer.
func readHead(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	head, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	head, _ = capOutput(head, limit)
	return head, nil
}

// capOutput cuts output to limit bytes and appends TruncationMarker when it
// was longer. It reports whether anything was cut.
func capOutput(output []byte, limit int) ([]byte, bool) {
	if len(output) > limit {
		return append(output[:limit:limit], TruncationMarker...), true
	}
	return output, false
}

// global uploads the executor-private file name as key in the user's
// run-global storage; a file that does not exist is skipped.
func (c *collector) global(ctx context.Context, name, key, contentType string) error {
	f, err := os.Open(filepath.Join(c.p.hostDir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return c.stored(c.p.in.Persist.PutGlobalFile(ctx, c.p.ref.UserID, key, f, contentType))
}

// stored records a successful upload and passes err through. A write the
// store dropped (a fenced store whose lease is lost, package fencedstore)
// stored nothing: it has no key, and is not one of the run's objects.
func (c *collector) stored(info persist.ObjectInfo, err error) error {
	if err == nil && info.Key == "" {
		c.p.log.Info("not stored: the store dropped the write")
		return nil
	}
	if err == nil {
		c.mu.Lock()
		c.out.objects = append(c.out.objects, info)
		c.mu.Unlock()
		c.p.log.Info("stored", "key", info.Key, "bytes", info.Size)
	}
	return err
}

// contentType is a stored file's media type, from its extension.
func contentType(name string) string {
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	return "application/octet-stream"
}
