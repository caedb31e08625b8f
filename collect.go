package taskrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/taskrun/taskrun/persist"
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
)

// Executor-private files in the run's host directory (plan.hostDir).
const (
	stdoutSpoolName   = "stdout.log"
	stderrSpoolName   = "stderr.log"
	gatewayRecordName = "gateway.jsonl"
	// keptRunName holds what RetryPersist needs (see keptrun.go).
	keptRunName = "run.json"
)

// Caps on what is collected from the run directory. The agent is untrusted;
// anything over a cap is skipped and recorded, never silently truncated.
const (
	maxCollectFileBytes  = 1 << 30
	maxCollectTotalBytes = 4 << 30
)

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
}

// collect stores whatever the run produced, even after a failure: the
// output logs, the trace, artifacts, the final answer, the session state and
// the isolation record. First it keeps a local copy of the execution and
// verdict, so that a failed upload can be retried by RetryPersist. Each step
// runs regardless of the others; their errors are joined.
func collect(ctx context.Context, p *plan, wd *workdir, ex execution, v verdict) (stored, error) {
	if ex.ContainerID == "" {
		return stored{}, nil // the agent never ran: there is nothing of it to keep
	}
	c := &collector{p: p}
	var errs []error
	keep := func(err error, what string) {
		if err != nil {
			errs = append(errs, fmt.Errorf("persist %s: %w", what, err))
		}
	}
	// The local copy matters only if an upload fails: a full host disk
	// that refuses it fails the persist only together with an upload.
	localErr := keepLocalState(p, wd, ex, v)
	keep(c.log(ctx, stdoutSpoolName, OutputLogName), "output log")
	keep(c.log(ctx, stderrSpoolName, StderrLogName), "stderr log")
	keep(c.trace(ctx), "trace")
	keep(c.gatewayRecord(ctx), "gateway record")
	keep(c.artifacts(ctx), "artifacts")
	keep(c.resultFiles(ctx), "output files")
	keep(c.sessionState(ctx), "session state")
	keep(c.kept(ctx, AuditRecordName, AuditRecordName, "application/json"), "isolation record")
	if localErr != nil && len(errs) == 0 {
		p.log.Warn("could not keep a local copy of the run's outcome; everything was stored", "err", localErr)
	} else {
		keep(localErr, "local copy")
	}
	if err := errors.Join(errs...); err != nil {
		p.log.Error("persist failed; the run directory is kept for a retry", "dir", p.dirs.Dir, "err", err)
		return c.out, err
	}
	return c.out, nil
}

// collector accumulates one collect call's result.
type collector struct {
	p   *plan
	out stored
}

// log uploads one spooled stream and keeps the head of the stdout log.
func (c *collector) log(ctx context.Context, spoolName, objectName string) error {
	if objectName == OutputLogName {
		head, err := readHead(filepath.Join(c.p.hostDir, spoolName), MaxResultOutputBytes)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		c.out.output = head
	}
	return c.kept(ctx, spoolName, objectName, "text/plain; charset=utf-8")
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
	return c.walk(ctx, c.p.dirs.Global, func(ctx context.Context, f workspace.CollectedFile) error {
		if !strings.HasPrefix(f.RelPath, prefix) {
			return nil
		}
		if f.RelPath == c.p.gatewayRecordPath {
			c.p.log.Warn("ignored a file the agent wrote in place of the gateway record", "path", f.RelPath)
			return nil // the executor's own copy is the only gateway record
		}
		if err := c.stored(c.p.in.Persist.PutGlobalFile(ctx, c.p.ref.UserID, f.RelPath, f.Reader, "application/x-ndjson")); err != nil {
			return err
		}
		if f.RelPath == want {
			c.out.tracePath = want
		}
		return nil
	})
}

// gatewayRecord uploads the executor-owned record of the model exchanges
// next to the trace, when the run had a model.
func (c *collector) gatewayRecord(ctx context.Context) error {
	f, err := os.Open(filepath.Join(c.p.hostDir, gatewayRecordName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return c.stored(c.p.in.Persist.PutGlobalFile(ctx, c.p.ref.UserID, c.p.gatewayRecordPath, f, "application/x-ndjson"))
}

// artifacts uploads every regular file under artifacts/.
func (c *collector) artifacts(ctx context.Context) error {
	c.out.artifactsDir = c.p.dirs.Artifacts
	return c.walk(ctx, c.p.dirs.Artifacts, func(ctx context.Context, f workspace.CollectedFile) error {
		info, err := c.p.in.ArtifactStorage.PutArtifact(ctx, c.p.ref, f.RelPath, f.Reader, contentType(f.RelPath))
		if err == nil {
			c.out.artifacts = append(c.out.artifacts, info)
		}
		return c.stored(info, err)
	})
}

// resultFiles uploads the final answer files under output/.
func (c *collector) resultFiles(ctx context.Context) error {
	return c.walk(ctx, c.p.dirs.Output, func(ctx context.Context, f workspace.CollectedFile) error {
		return c.stored(c.p.in.Persist.PutRunFile(ctx, c.p.ref, ResultPrefix+f.RelPath, f.Reader, contentType(f.RelPath)))
	})
}

// sessionState streams home as a tar.gz straight into the store.
func (c *collector) sessionState(ctx context.Context) error {
	pr, pw := io.Pipe()
	go func() {
		_, err := workspace.PackHome(ctx, c.p.dirs.Home, pw, workspace.PackOptions{Exclude: c.p.sessionExcludes})
		pw.CloseWithError(err)
	}()
	err := c.stored(c.p.in.Persist.PutRunFile(ctx, c.p.ref, SessionStateName, pr, "application/gzip"))
	pr.CloseWithError(err)
	return err
}

// stored records a successful upload and passes err through.
func (c *collector) stored(info persist.ObjectInfo, err error) error {
	if err == nil {
		c.out.objects = append(c.out.objects, info)
		c.p.log.Info("stored", "key", info.Key, "bytes", info.Size)
	}
	return err
}

// walk walks root with the hostile-input-safe collector and logs every file
// it skipped.
func (c *collector) walk(ctx context.Context, root string, visit func(context.Context, workspace.CollectedFile) error) error {
	rep, err := workspace.Collect(ctx, root, workspace.CollectOptions{
		MaxFileBytes:  maxCollectFileBytes,
		MaxTotalBytes: maxCollectTotalBytes,
	}, visit)
	for _, s := range rep.Skipped {
		c.p.log.Warn("skipped file in run output", "root", filepath.Base(root), "path", s.Path, "reason", s.Reason)
	}
	if rep.DroppedSkips > 0 {
		c.p.log.Warn("more files skipped in run output", "root", filepath.Base(root), "count", rep.DroppedSkips)
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
