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
)

// Caps on what is collected from the run directory. The agent is untrusted;
// anything over a cap is skipped and recorded, never silently truncated.
const (
	maxCollectFileBytes  = 1 << 30
	maxCollectTotalBytes = 4 << 30
)

// persist stores whatever the run produced, even after a failure: the output
// logs, the trace, artifacts, the final answer and the session state. Each step
// runs regardless of the others; their errors are joined.
//
// runErr is kept with the local copy, so that RetryPersist can report the
// run as RunTask would have.
func (r *runner) persist(ctx context.Context, runErr error) error {
	if r.out.ContainerID == "" {
		return nil // the agent never ran: there is nothing of it to keep
	}
	r.out.Stored, r.out.Artifacts = nil, nil
	var errs []error
	keep := func(err error, what string) {
		if err != nil {
			errs = append(errs, fmt.Errorf("persist %s: %w", what, err))
		}
	}
	keep(r.keepLocalState(runErr), "local copy")
	keep(r.persistLog(ctx, stdoutSpoolName, OutputLogName), "output log")
	keep(r.persistLog(ctx, stderrSpoolName, StderrLogName), "stderr log")
	keep(r.persistTrace(ctx), "trace")
	keep(r.persistGatewayRecord(ctx), "gateway record")
	keep(r.persistArtifacts(ctx), "artifacts")
	keep(r.persistResultFiles(ctx), "output files")
	keep(r.persistSessionState(ctx), "session state")
	keep(r.persistKept(ctx, keptRecordName, AuditRecordName, "application/json"), "isolation record")
	if err := errors.Join(errs...); err != nil {
		r.log.Error("persist failed; the run directory is kept for a retry", "dir", r.dirs.Dir, "err", err)
		return err
	}
	return nil
}

// persistLog uploads one spooled stream and fills the result's output from
// the stdout log.
func (r *runner) persistLog(ctx context.Context, spoolName, objectName string) error {
	if objectName == OutputLogName {
		if err := r.readResultOutput(filepath.Join(r.hostDir, spoolName)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return r.persistKept(ctx, spoolName, objectName, "text/plain; charset=utf-8")
}

// persistKept uploads the executor-private file name as the run object
// objectName; a file that does not exist is skipped.
func (r *runner) persistKept(ctx context.Context, name, objectName, contentType string) error {
	f, err := os.Open(filepath.Join(r.hostDir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return r.stored(r.in.Persist.PutRunFile(ctx, r.ref, objectName, f, contentType))
}

// readResultOutput fills Output with the head of the stdout log at path,
// capped with an explicit marker.
func (r *runner) readResultOutput(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	head, err := io.ReadAll(io.LimitReader(f, MaxResultOutputBytes+1))
	if err != nil {
		return err
	}
	head, _ = capOutput(head, MaxResultOutputBytes)
	r.out.Result.Output = head
	r.out.Result.OutputStr = string(head)
	return nil
}

// capOutput cuts output to limit bytes and appends TruncationMarker when it
// was longer. It reports whether anything was cut.
func capOutput(output []byte, limit int) ([]byte, bool) {
	if len(output) > limit {
		return append(output[:limit:limit], TruncationMarker...), true
	}
	return output, false
}

// persistTrace uploads the session's traces from global/traces/<session>/ to
// run-global storage and sets TracePath when the agent wrote this run's trace.
func (r *runner) persistTrace(ctx context.Context) error {
	want := r.tracePath()
	prefix := path.Dir(want) + "/"
	return r.collect(ctx, r.dirs.Global, func(ctx context.Context, f workspace.CollectedFile) error {
		if !strings.HasPrefix(f.RelPath, prefix) {
			return nil
		}
		if f.RelPath == r.gatewayRecordPath() {
			r.log.Warn("ignored a file the agent wrote in place of the gateway record", "path", f.RelPath)
			return nil // the executor's own copy is the only gateway record
		}
		if err := r.stored(r.in.Persist.PutGlobalFile(ctx, r.ref.UserID, f.RelPath, f.Reader, "application/x-ndjson")); err != nil {
			return err
		}
		if f.RelPath == want {
			r.out.Result.TracePath = want
		}
		return nil
	})
}

// persistGatewayRecord uploads the executor-owned record of the model
// exchanges as traces/<session>/gw_<run>.jsonl, when the run had a model.
func (r *runner) persistGatewayRecord(ctx context.Context) error {
	f, err := os.Open(filepath.Join(r.hostDir, gatewayRecordName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return r.stored(r.in.Persist.PutGlobalFile(ctx, r.ref.UserID, r.gatewayRecordPath(), f, "application/x-ndjson"))
}

// persistArtifacts uploads every regular file under artifacts/.
func (r *runner) persistArtifacts(ctx context.Context) error {
	r.out.Result.RunArtifactsDir = r.dirs.Artifacts
	return r.collect(ctx, r.dirs.Artifacts, func(ctx context.Context, f workspace.CollectedFile) error {
		info, err := r.in.ArtifactStorage.PutArtifact(ctx, r.ref, f.RelPath, f.Reader, contentType(f.RelPath))
		if err == nil {
			r.out.Artifacts = append(r.out.Artifacts, info)
		}
		return r.stored(info, err)
	})
}

// persistResultFiles uploads the final answer files under output/.
func (r *runner) persistResultFiles(ctx context.Context) error {
	return r.collect(ctx, r.dirs.Output, func(ctx context.Context, f workspace.CollectedFile) error {
		return r.stored(r.in.Persist.PutRunFile(ctx, r.ref, ResultPrefix+f.RelPath, f.Reader, contentType(f.RelPath)))
	})
}

// persistSessionState streams home as a tar.gz straight into the store.
func (r *runner) persistSessionState(ctx context.Context) error {
	pr, pw := io.Pipe()
	go func() {
		excludes := r.in.SessionExcludes
		if excludes == nil {
			excludes = workspace.DefaultExcludes
		}
		_, err := workspace.PackHome(ctx, r.dirs.Home, pw, workspace.PackOptions{Exclude: excludes})
		pw.CloseWithError(err)
	}()
	err := r.stored(r.in.Persist.PutRunFile(ctx, r.ref, SessionStateName, pr, "application/gzip"))
	pr.CloseWithError(err)
	return err
}

// stored records a successful upload in the outcome and passes err through.
func (r *runner) stored(info persist.ObjectInfo, err error) error {
	if err == nil {
		r.out.Stored = append(r.out.Stored, info)
		r.log.Info("stored", "key", info.Key, "bytes", info.Size)
	}
	return err
}

// collect walks root with the hostile-input-safe collector and logs every
// file it skipped.
func (r *runner) collect(ctx context.Context, root string, visit func(context.Context, workspace.CollectedFile) error) error {
	rep, err := workspace.Collect(ctx, root, workspace.CollectOptions{
		MaxFileBytes:  maxCollectFileBytes,
		MaxTotalBytes: maxCollectTotalBytes,
	}, visit)
	for _, s := range rep.Skipped {
		r.log.Warn("skipped file in run output", "root", filepath.Base(root), "path", s.Path, "reason", s.Reason)
	}
	if rep.DroppedSkips > 0 {
		r.log.Warn("more files skipped in run output", "root", filepath.Base(root), "count", rep.DroppedSkips)
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
