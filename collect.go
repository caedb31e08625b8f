package taskrun

import (
	"bytes"
	"context"
	"encoding/json"
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
	"github.com/taskrun/taskrun/workspace"
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
	// keptRunName holds what RetryPersist needs (see keptrun.go).
	keptRunName = "run.json"
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

// collect stores whatever the run produced, even after a failure: the
// output logs, the trace, artifacts, the final answer, the session state and
// the isolation record. Each step runs regardless of the others; their
// errors are joined.
// hooks store their own records (collectHook), the isolation record among
// them, beside the agent's files.
func collect(ctx context.Context, p *plan, wd *workdir, ex execution, v verdict, hooks []hook) (stored, error) {
	c := &collector{p: p, ledger: workspace.NewLedger(p.limits.collect)}
	stopPersist := p.timings.Start(timings.Persist)
	// The executor's own records and the agent's files are stored side by
	// side. The agent's files are walked one root after another, always in
	// this order: the ledger admits a hard-linked file once, for the first
	// walk that meets it, and bounds what all of them read together.
	var records, files persistSteps
	var wg sync.WaitGroup
	wg.Go(func() {
		var resp collectResponse
		collectAll(ctx, hooks, &collectRequest{Kept: c.kept, Global: c.global, Put: c.put}, &resp, records.do)
		c.out.changes, c.out.output = resp.Changes, resp.Output
	})
	files.do(c.trace(ctx), "trace")
	files.do(c.artifacts(ctx), "artifacts")
	files.do(c.resultFiles(ctx), "output files")
	files.do(c.sessionState(ctx), "session state")
	wg.Wait()
	// The collection record lists what every walk skipped.
	files.do(c.collectionRecord(ctx, ex), "collection record")
	// The attestation covers every object above.
	files.do(c.attestation(ctx, wd, ex, v), "attestation")
	stopPersist()
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
// and the agent's files are stored concurrently (see collect): each field
// of out is written by one of them only, but for objects, which mu guards.
type collector struct {
	p   *plan
	mu  sync.Mutex
	out stored
	// ledger is shared by every walk of the run's files.
	ledger *workspace.Ledger
}

// skip records that the agent's file root/rel was not stored.
func (c *collector) skip(root, rel, reason string) {
	if len(c.out.skipped) >= workspace.MaxSkips {
		c.out.droppedSkips++
		return
	}
	c.out.skipped = append(c.out.skipped, SkippedFile{Root: root, Path: rel, Reason: reason})
}

// unstorable reports whether err is a refusal of one agent file's name
// (a name no key can take, one reserved for a run's records, or a key the
// store refuses): that file is skipped, the others are stored, and a retry
// would skip it the same way.
func unstorable(err error) bool {
	return errors.Is(err, persist.ErrInvalidName) || errors.Is(err, persist.ErrReservedName) || errors.Is(err, persist.ErrKeyRejected)
}

// storeAgentFile stores one of the agent's files through put; a name that
// cannot be stored is skipped with the reason.
func (c *collector) storeAgentFile(root, rel string, put func() (persist.ObjectInfo, error)) (bool, error) {
	info, err := put()
	if unstorable(err) {
		c.p.log.Warn("skipped file in run output", "root", root, "path", rel, "reason", err)
		c.skip(root, rel, err.Error())
		return false, nil
	}
	return err == nil, c.stored(info, err)
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

// trace uploads the session's traces from global/traces/<session>/ to
// run-global storage and notes when the agent wrote this run's trace.
func (c *collector) trace(ctx context.Context) error {
	want := c.p.tracePath
	prefix := path.Dir(want) + "/"
	return c.walk(ctx, rootGlobal, c.p.dirs.Global, func(ctx context.Context, f workspace.CollectedFile) error {
		if !strings.HasPrefix(f.RelPath, prefix) {
			return nil
		}
		ok, err := c.storeAgentFile(rootGlobal, f.RelPath, func() (persist.ObjectInfo, error) {
			// Another run's trace and every gateway record are the
			// executor's: no agent file may take their keys.
			if err := persist.CheckAgentGlobalPath(c.p.ref.RunID, f.RelPath); err != nil {
				return persist.ObjectInfo{}, err
			}
			return c.p.in.Persist.PutGlobalFile(ctx, c.p.ref.UserID, f.RelPath, f.Reader, "application/x-ndjson")
		})
		if err != nil {
			return err
		}
		if ok && f.RelPath == want {
			c.out.tracePath = want
		}
		return nil
	})
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

// artifacts uploads every regular file under artifacts/.
func (c *collector) artifacts(ctx context.Context) error {
	c.out.artifactsDir = c.p.dirs.Artifacts
	return c.walk(ctx, rootArtifacts, c.p.dirs.Artifacts, func(ctx context.Context, f workspace.CollectedFile) error {
		var info persist.ObjectInfo
		ok, err := c.storeAgentFile(rootArtifacts, f.RelPath, func() (persist.ObjectInfo, error) {
			var err error
			info, err = c.p.in.ArtifactStorage.PutArtifact(ctx, c.p.ref, f.RelPath, f.Reader, contentType(f.RelPath))
			return info, err
		})
		if ok {
			c.out.artifacts = append(c.out.artifacts, info)
		}
		return err
	})
}

// resultFiles uploads the final answer files under output/.
func (c *collector) resultFiles(ctx context.Context) error {
	return c.walk(ctx, rootOutput, c.p.dirs.Output, func(ctx context.Context, f workspace.CollectedFile) error {
		_, err := c.storeAgentFile(rootOutput, f.RelPath, func() (persist.ObjectInfo, error) {
			return c.p.in.Persist.PutRunFile(ctx, c.p.ref, ResultPrefix+f.RelPath, f.Reader, contentType(f.RelPath))
		})
		return err
	})
}

// sessionState streams home as a tar.gz straight into the store.
func (c *collector) sessionState(ctx context.Context) error {
	pr, pw := io.Pipe()
	packed := make(chan workspace.PackStats, 1)
	go func() {
		stats, err := workspace.PackHome(ctx, c.p.dirs.Home, pw, workspace.PackOptions{Exclude: c.p.sessionExcludes, Ledger: c.ledger})
		pw.CloseWithError(err)
		packed <- stats
	}()
	err := c.stored(c.p.in.Persist.PutRunFile(ctx, c.p.ref, SessionStateName, pr, "application/gzip"))
	pr.CloseWithError(err)
	stats := <-packed
	c.skipped(rootHome, stats.Skipped, stats.DroppedSkips)
	return err
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

// walk walks the run directory root (named name) with the
// hostile-input-safe collector, through the run's ledger, and records every
// file it skipped.
func (c *collector) walk(ctx context.Context, name, root string, visit func(context.Context, workspace.CollectedFile) error) error {
	rep, err := workspace.Collect(ctx, root, workspace.CollectOptions{
		MaxFileBytes:  maxCollectFileBytes,
		MaxTotalBytes: c.p.limits.collect,
		Ledger:        c.ledger,
	}, visit)
	c.skipped(name, rep.Skipped, rep.DroppedSkips)
	return err
}

// skipped logs and records the skips of one walk of root.
func (c *collector) skipped(root string, skips []workspace.Skip, dropped int64) {
	for _, s := range skips {
		c.p.log.Warn("skipped file in run output", "root", root, "path", s.Path, "reason", s.Reason)
		c.skip(root, s.Path, s.Reason)
	}
	if dropped > 0 {
		c.p.log.Warn("more files skipped in run output", "root", root, "count", dropped)
		c.out.droppedSkips += dropped
	}
}

// collectionRecord stores what collection left out and what the run's
// host records dropped, as CollectionRecordName.
func (c *collector) collectionRecord(ctx context.Context, ex execution) error {
	rec := CollectionRecord{
		Skipped:            c.out.skipped,
		DroppedSkips:       c.out.droppedSkips,
		ReadBytes:          c.ledger.Read(),
		ReadLimitBytes:     c.ledger.Limit(),
		DroppedRecordBytes: ex.DroppedRecordBytes,
		RecordBudgetBytes:  c.p.limits.records,
	}
	if rec.Skipped == nil {
		rec.Skipped = []SkippedFile{}
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return c.stored(c.p.in.Persist.PutRunFile(ctx, c.p.ref, CollectionRecordName, bytes.NewReader(data), "application/json"))
}

// contentType is a stored file's media type, from its extension.
func contentType(name string) string {
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	return "application/octet-stream"
}
