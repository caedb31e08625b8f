package executor

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/workerclient"
)

// Names of the change set's run objects.
const (
	ChangesPatchName = "changes.patch"
	ChangesListName  = "changes.json"
)

// changesBaseDir is the executor-private directory (in plan.hostDir) where
// prepare records the starting tree for the change set.
const changesBaseDir = "changes-base"

// ContainerName is the name of a run's container, so that `docker ps` and
// `taskrun audit` show which run is which.
func ContainerName(runID string) string {
	return "taskrun-" + runID
}

// SpoolPath is the executor's spool of a live run's stdout (or stderr) on
// this host, as `taskrun logs --follow` reads it; it is removed with the
// run's directory.
func SpoolPath(paths RuntimePaths, ref model.RunRef, stderr bool) (string, error) {
	if err := ref.Validate(); err != nil {
		return "", err
	}
	name := stdoutSpoolName
	if stderr {
		name = stderrSpoolName
	}
	return filepath.Join(paths.RuntimeTaskRunDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID)+hostDirSuffix, name), nil
}

// patchChanges is the change set as the PATCH names it.
func patchChanges(r *changeResult) *workerclient.ChangeSet {
	if r == nil {
		return nil
	}
	s := r.set.Summary
	return &workerclient.ChangeSet{
		Patch:       artifactOf(r.patch),
		List:        artifactOf(r.list),
		TreeHash:    r.set.TreeHash,
		BaseCommit:  r.set.BaseCommit,
		Files:       s.Files,
		Added:       s.Added,
		Deleted:     s.Deleted,
		Modified:    s.Modified,
		Renamed:     s.Renamed,
		ModeChanged: s.ModeChanged,
		TypeChanged: s.TypeChanged,
		Omitted:     s.Omitted,
		Insertions:  s.Insertions,
		Deletions:   s.Deletions,
	}
}

func artifactOf(o persist.ObjectInfo) workerclient.Artifact {
	return workerclient.Artifact{Key: o.Key, Size: o.Size, SHA256: o.SHA256, ContentType: o.ContentType}
}

// indexRecord is the run's entry in the store's run index; out is nil while
// the run is in progress.
func indexRecord(p *plan, wd *workdir, ex execution, out *Outcome, st stored) *runindex.Record {
	host, _ := os.Hostname()
	rec := &runindex.Record{
		RunID:          p.ref.RunID,
		UserID:         p.ref.UserID,
		ConversationID: p.ref.ConversationID,
		TaskID:         p.ref.TaskID,
		SessionID:      p.in.SessionID,
		ParentRunID:    p.in.Run.ParentRunID,
		Status:         model.StatusRunning,
		Start:          wd.started.UTC(),
		Image:          p.spec.Image,
		ImageDigest:    ex.ImageDigest,
		Runtime:        ex.Runtime,
		ContainerID:    ex.ContainerID,
		ContainerName:  ContainerName(p.ref.RunID),
		Host:           host,
		Limits: map[string]any{
			"memory_bytes":     p.policy.MemoryBytes,
			"nano_cpus":        p.policy.NanoCPUs,
			"pids":             p.policy.PidsLimit,
			"disk_bytes":       p.limits.disk,
			"max_output_bytes": p.limits.maxOutput,
			"timeout":          p.spec.Timeout.String(),
		},
		PromptTokens:     ex.PromptTokens,
		CompletionTokens: ex.CompletionTokens,
		Isolation:        isolationVerdict(ex.isolation),
		Usage:            ex.Usage,
	}
	rec.Timings = p.timings.Spans()
	if out == nil {
		return rec
	}
	rec.Status, rec.Reason = out.Status, out.Reason
	rec.End = time.UnixMilli(out.Result.EndTime).UTC()
	if out.ContainerID != "" {
		rec.ExitCode = &out.Exit.ExitCode
	}
	rec.Stored = out.Stored
	rec.Checkpoint = out.Checkpoint
	for _, o := range out.Stored {
		switch o.Key {
		case runKey(p, OutputLogName):
			rec.Keys.Log = o.Key
		case runKey(p, StderrLogName):
			rec.Keys.Stderr = o.Key
		case runKey(p, ChangesPatchName):
			rec.Keys.Patch = o.Key
		case runKey(p, ChangesListName):
			rec.Keys.Changes = o.Key
		case runKey(p, SessionStateName):
			rec.Keys.State = o.Key
		case runKey(p, AuditRecordName):
			rec.Keys.Audit = o.Key
		}
	}
	if st.tracePath != "" {
		rec.Keys.Trace, _ = persist.GlobalKey(p.ref.UserID, st.tracePath)
	}
	if c := st.changes; c != nil {
		rec.Changes = &runindex.Changes{BaseCommit: c.set.BaseCommit, TreeHash: c.set.TreeHash, Summary: c.set.Summary}
	}
	return rec
}

func runKey(p *plan, name string) string {
	k, _ := persist.RunKey(p.ref, name)
	return k
}

// isolationVerdict summarises the isolation record for the run index, as
// audit.Record.Verdict counts it.
func isolationVerdict(r *audit.Record) string {
	if r == nil {
		return ""
	}
	return r.Verdict()
}

// writeIndex stores rec in the run index when the store keeps one. The
// index only helps find runs: a failure is logged, never fatal.
func writeIndex(ctx context.Context, p *plan, rec *runindex.Record) {
	w, ok := p.in.Persist.(runindex.Writer)
	if !ok {
		return
	}
	if _, err := runindex.Put(ctx, w, rec); err != nil {
		p.log.Warn("run index not updated", "status", rec.Status, "err", err)
	}
}
