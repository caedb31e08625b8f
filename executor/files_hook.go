package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"path"
	"strings"

	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/workspace"
)

// filesHook is the agent's files: what it left in the run directory, and
// the records that cover every object the run stored.
//
//	Collect  (beside the other hooks' Collect) the session's traces,
//	         artifacts/, output/ and the session state (home) are stored,
//	         walked one root after another through one ledger, skipping
//	         (and listing) what cannot be stored
//	Seal     (after every Collect) the collection record, then the
//	         attestation over every object stored, itself excepted
//
// It also runs for a kept run (RetryPersist, recoverRun).
type filesHook struct {
	p  *plan
	wd *workdir
	// ledger is shared by every walk of the run's files.
	ledger *workspace.Ledger
	// stored records one store's result as one of the run's objects.
	stored func(persist.ObjectInfo, error) error
	// artifacts are the stored artifacts, in path order; artifactsDir the
	// host directory they came from; tracePath is set when the agent
	// wrote this run's trace.
	artifacts    []persist.ObjectInfo
	artifactsDir string
	tracePath    string
	// skipped lists the agent's files not stored (the first
	// workspace.MaxSkips); droppedSkips counts the others.
	skipped      []SkippedFile
	droppedSkips int64
}

func (h *filesHook) name() string { return "files" }

// collectBeside stores the agent's files. The roots are walked always in
// this order: the ledger admits a hard-linked file once, for the first
// walk that meets it, and bounds what all of them read together.
func (h *filesHook) collectBeside(ctx context.Context, req *collectRequest, resp *collectResponse, step func(err error, what string)) {
	h.ledger, h.stored = workspace.NewLedger(h.p.limits.collect), req.Stored
	step(h.trace(ctx), "trace")
	step(h.artifactFiles(ctx), "artifacts")
	step(h.resultFiles(ctx), "output files")
	step(h.sessionState(ctx), "session state")
	resp.Artifacts, resp.ArtifactsDir, resp.TracePath = h.artifacts, h.artifactsDir, h.tracePath
}

// seal stores the collection record, which lists what every walk skipped,
// then the attestation, which covers every object stored before it.
func (h *filesHook) seal(ctx context.Context, req *sealRequest, resp *collectResponse, step func(err error, what string)) {
	step(h.collectionRecord(ctx, req.Exec.DroppedRecordBytes), "collection record")
	step(h.attestation(ctx, req.Objects(), req.Exec, req.Verdict), "attestation")
	resp.Skipped, resp.DroppedSkips = h.skipped, h.droppedSkips
}

// skip records that the agent's file root/rel was not stored.
func (h *filesHook) skip(root, rel, reason string) {
	if len(h.skipped) >= workspace.MaxSkips {
		h.droppedSkips++
		return
	}
	h.skipped = append(h.skipped, SkippedFile{Root: root, Path: rel, Reason: reason})
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
func (h *filesHook) storeAgentFile(root, rel string, put func() (persist.ObjectInfo, error)) (bool, error) {
	info, err := put()
	if unstorable(err) {
		h.p.log.Warn("skipped file in run output", "root", root, "path", rel, "reason", err)
		h.skip(root, rel, err.Error())
		return false, nil
	}
	return err == nil, h.stored(info, err)
}

// trace uploads the session's traces from global/traces/<session>/ to
// run-global storage and notes when the agent wrote this run's trace.
func (h *filesHook) trace(ctx context.Context) error {
	want := h.p.tracePath
	prefix := path.Dir(want) + "/"
	return h.walk(ctx, rootGlobal, h.p.dirs.Global, func(ctx context.Context, f workspace.CollectedFile) error {
		if !strings.HasPrefix(f.RelPath, prefix) {
			return nil
		}
		ok, err := h.storeAgentFile(rootGlobal, f.RelPath, func() (persist.ObjectInfo, error) {
			// Another run's trace and every gateway record are the
			// executor's: no agent file may take their keys.
			if err := persist.CheckAgentGlobalPath(h.p.ref.RunID, f.RelPath); err != nil {
				return persist.ObjectInfo{}, err
			}
			return h.p.in.Persist.PutGlobalFile(ctx, h.p.ref.UserID, f.RelPath, f.Reader, "application/x-ndjson")
		})
		if err != nil {
			return err
		}
		if ok && f.RelPath == want {
			h.tracePath = want
		}
		return nil
	})
}

// artifactFiles uploads every regular file under artifacts/.
func (h *filesHook) artifactFiles(ctx context.Context) error {
	h.artifactsDir = h.p.dirs.Artifacts
	return h.walk(ctx, rootArtifacts, h.p.dirs.Artifacts, func(ctx context.Context, f workspace.CollectedFile) error {
		var info persist.ObjectInfo
		ok, err := h.storeAgentFile(rootArtifacts, f.RelPath, func() (persist.ObjectInfo, error) {
			var err error
			info, err = h.p.in.ArtifactStorage.PutArtifact(ctx, h.p.ref, f.RelPath, f.Reader, contentType(f.RelPath))
			return info, err
		})
		if ok {
			h.artifacts = append(h.artifacts, info)
		}
		return err
	})
}

// resultFiles uploads the final answer files under output/.
func (h *filesHook) resultFiles(ctx context.Context) error {
	return h.walk(ctx, rootOutput, h.p.dirs.Output, func(ctx context.Context, f workspace.CollectedFile) error {
		_, err := h.storeAgentFile(rootOutput, f.RelPath, func() (persist.ObjectInfo, error) {
			return h.p.in.Persist.PutRunFile(ctx, h.p.ref, ResultPrefix+f.RelPath, f.Reader, contentType(f.RelPath))
		})
		return err
	})
}

// sessionState streams home as a tar.gz straight into the store.
func (h *filesHook) sessionState(ctx context.Context) error {
	pr, pw := io.Pipe()
	packed := make(chan workspace.PackStats, 1)
	go func() {
		stats, err := workspace.PackHome(ctx, h.p.dirs.Home, pw, workspace.PackOptions{Exclude: h.p.sessionExcludes, Ledger: h.ledger})
		pw.CloseWithError(err)
		packed <- stats
	}()
	err := h.stored(h.p.in.Persist.PutRunFile(ctx, h.p.ref, SessionStateName, pr, "application/gzip"))
	pr.CloseWithError(err)
	stats := <-packed
	h.noteSkips(rootHome, stats.Skipped, stats.DroppedSkips)
	return err
}

// walk walks the run directory root (named name) with the
// hostile-input-safe collector, through the run's ledger, and records every
// file it skipped.
func (h *filesHook) walk(ctx context.Context, name, root string, visit func(context.Context, workspace.CollectedFile) error) error {
	rep, err := workspace.Collect(ctx, root, workspace.CollectOptions{
		MaxFileBytes:  maxCollectFileBytes,
		MaxTotalBytes: h.p.limits.collect,
		Ledger:        h.ledger,
	}, visit)
	h.noteSkips(name, rep.Skipped, rep.DroppedSkips)
	return err
}

// noteSkips logs and records the skips of one walk of root.
func (h *filesHook) noteSkips(root string, skips []workspace.Skip, dropped int64) {
	for _, s := range skips {
		h.p.log.Warn("skipped file in run output", "root", root, "path", s.Path, "reason", s.Reason)
		h.skip(root, s.Path, s.Reason)
	}
	if dropped > 0 {
		h.p.log.Warn("more files skipped in run output", "root", root, "count", dropped)
		h.droppedSkips += dropped
	}
}

// collectionRecord stores what collection left out and what the run's
// host records dropped, as CollectionRecordName.
func (h *filesHook) collectionRecord(ctx context.Context, droppedRecordBytes int64) error {
	rec := CollectionRecord{
		Skipped:            h.skipped,
		DroppedSkips:       h.droppedSkips,
		ReadBytes:          h.ledger.Read(),
		ReadLimitBytes:     h.ledger.Limit(),
		DroppedRecordBytes: droppedRecordBytes,
		RecordBudgetBytes:  h.p.limits.records,
	}
	if rec.Skipped == nil {
		rec.Skipped = []SkippedFile{}
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return h.stored(h.p.in.Persist.PutRunFile(ctx, h.p.ref, CollectionRecordName, bytes.NewReader(data), "application/json"))
}
