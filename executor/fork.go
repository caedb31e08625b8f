package executor

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workspace"
)

// ErrForkState means the state a fork starts from is not the one its
// parent's record names: it was changed after it was stored.
var ErrForkState = errors.New("fork state digest mismatch")

// ForkPointPrefix is where ForkPoint stores the home of a live run it
// leaves running, as the run's object ForkPointPrefix+ID+"/"+SessionStateName.
const ForkPointPrefix = "checkpoint/fork-"

// ForkFrom is what a fork starts from: a checkpoint of its parent, or its
// parent's stored home. Exactly one of Checkpoint and State is set.
type ForkFrom struct {
	// Checkpoint is the parent's stored checkpoint, as the parent's record
	// keeps it (a PAUSED run's Outcome.Checkpoint or
	// runindex.Record.Checkpoint). A memory checkpoint goes on in each fork
	// where the parent stopped; a files one starts the fork's command in
	// the parent's kept home.
	Checkpoint *checkpoint.Manifest `json:"checkpoint,omitempty"`
	// State is a stored home of the parent (its session state once it
	// ended, or what ForkPoint stored of it live): the fork's command
	// starts in a copy of it.
	State *ForkState `json:"state,omitempty"`
}

// ForkState names a stored home of the parent run.
type ForkState struct {
	// Object is the parent's run object (SessionStateName, or ForkPoint's).
	Object string `json:"object"`
	// SHA256 is its hex digest, as the parent's record keeps it
	// (persist.ObjectInfo.SHA256): the fork refuses anything else.
	SHA256 string `json:"sha256"`
}

// Fork runs spec, a new run forked from the run spec.Run.ParentRunID
// of the same tenant, conversation and task, from what from names, to its
// end as Run does. The fork is a run of its own: its own run ID, uid, run
// directory, gateway, egress proxy, records and outputs, its records
// naming its parent, its change set against the original workspace
// (spec.Task.WorkspaceDir, with the tenant's persistent files), not
// against the parent's home. The parent is only read.
//
// Before anything is written or reported the fork is checked: a checkpoint
// or state that names another run or tenant than the fork's parent (its
// tenant) fails with checkpoint.ErrForeign, a changed archive with
// checkpoint.ErrDigest, a changed state with ErrForkState, and a policy
// looser than the parent's checkpoint with checkpoint.ErrLooserPolicy. A
// memory checkpoint restores the parent's processes: the parent's output
// up to the checkpoint begins the fork's output log.
func (h *Host) Fork(ctx context.Context, spec Spec, from ForkFrom) (*Outcome, error) {
	if err := h.canRun(); err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	parent := spec.Run.ParentRunID
	if parent == "" {
		return nil, fmt.Errorf("%w: fork run %s: Spec.Run.ParentRunID must name the run it is forked from", ErrInvalidInput, spec.Run.ID)
	}
	if (from.Checkpoint == nil) == (from.State == nil) {
		return nil, fmt.Errorf("%w: fork run %s: name either the parent's checkpoint or its stored state", ErrInvalidInput, spec.Run.ID)
	}
	in := h.runInput(spec)
	ref := model.RunRef{UserID: spec.Task.UserID, ConversationID: spec.Task.ConversationID, TaskID: spec.Task.ID, RunID: spec.Run.ID}
	parentRef := ref.WithRun(parent)
	pol := in.Policy
	if pol == (sandbox.Policy{}) {
		pol = sandbox.DefaultPolicy()
	}
	dir, err := os.MkdirTemp(h.layout.Root(), "fork-")
	if err != nil {
		return nil, fmt.Errorf("executor: fork run %s: %w", ref.RunID, err)
	}
	defer os.RemoveAll(dir)
	rs := &restore{from: parent, fork: true}
	switch {
	case from.Checkpoint != nil:
		m := *from.Checkpoint
		// The checkpoint is bound to the parent: it must name the parent
		// and the fork's tenant, and the archive's own manifest must too.
		if m.Tenant != ref.UserID || m.Run != parent {
			return nil, fmt.Errorf("executor: fork run %s from run %s of tenant %s: %w: the checkpoint names run %q of tenant %q",
				ref.RunID, parent, ref.UserID, checkpoint.ErrForeign, m.Run, m.Tenant)
		}
		if err := checkRestore(h.cfg.Backend, parentRef, m, pol); err != nil {
			return nil, fmt.Errorf("executor: fork run %s: %w", ref.RunID, err)
		}
		img, err := os.MkdirTemp(dir, "image-")
		if err != nil {
			return nil, fmt.Errorf("executor: fork run %s: %w", ref.RunID, err)
		}
		if _, err := checkpoint.Load(ctx, h.cfg.Store, parentRef, m, img, dir, maxCheckpointBytes(pol)); err != nil {
			return nil, fmt.Errorf("executor: fork run %s from run %s: %w", ref.RunID, parent, err)
		}
		rs.dir, rs.manifest = img, m
	default:
		st := *from.State
		if !forkStateObject(st.Object) {
			return nil, fmt.Errorf("executor: fork run %s: %w: %q is not a stored home of run %s", ref.RunID, checkpoint.ErrForeign, st.Object, parent)
		}
		rs.manifest = checkpoint.Manifest{Kind: sandbox.CheckpointFiles, Tenant: ref.UserID, Run: parent, Runtime: pol.Runtime}
		rs.stateObject = st.Object
		if rs.statePath, err = fetchState(ctx, h.cfg.Store, parentRef, st, dir); err != nil {
			return nil, fmt.Errorf("executor: fork run %s from run %s: %w", ref.RunID, parent, err)
		}
	}
	if rs.manifest.Kind == sandbox.CheckpointFiles && rs.statePath == "" {
		// A files checkpoint keeps the parent's home as its session state.
		rs.stateObject = SessionStateName
	}
	in.restore = rs
	return execute(ctx, in)
}

// forkStateObject reports whether name is a stored home a fork may start
// from: a run's session state, or what ForkPoint stored.
func forkStateObject(name string) bool {
	if name == SessionStateName {
		return true
	}
	id, ok := strings.CutPrefix(name, ForkPointPrefix)
	if !ok {
		return false
	}
	id, ok = strings.CutSuffix(id, "/"+SessionStateName)
	return ok && id != "" && path.Clean(name) == name && model.ValidateID("fork point", id) == nil
}

// fetchState copies the parent's stored home st into a file under dir and
// returns its path, once its digest is the one the parent's record names.
func fetchState(ctx context.Context, st Store, parent model.RunRef, s ForkState, dir string) (string, error) {
	if s.SHA256 == "" {
		return "", fmt.Errorf("%w: the parent's record names no digest of %s", ErrForkState, s.Object)
	}
	rc, err := st.OpenRunFile(ctx, parent, s.Object)
	if err != nil {
		return "", fmt.Errorf("fetch %s: %w", s.Object, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(dir, "state-*.tar.gz")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sum := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, sum), rc); err != nil {
		return "", fmt.Errorf("fetch %s: %w", s.Object, err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != strings.TrimPrefix(s.SHA256, "sha256:") {
		return "", fmt.Errorf("%w: %s is %s, the parent's record names %s; it was changed after it was stored", ErrForkState, s.Object, got, s.SHA256)
	}
	return f.Name(), f.Close()
}

// ForkPoint stores the home of the live run runID as it is now, leaving
// the run running, as its object ForkPointPrefix+ID+"/"+SessionStateName,
// and returns what Fork starts a fork from it with. Its processes and
// memory are not part of it: a fork starts its command again in a copy of
// that home (pause the run for a fork that keeps memory).
func (h *Host) ForkPoint(ctx context.Context, runID string) (ForkFrom, error) {
	r := h.live.get(runID)
	if r == nil {
		return ForkFrom{}, fmt.Errorf("executor: fork point of run %s: %w", runID, ErrNotLive)
	}
	p, pz := r.p, &r.pausing
	// The run's directory stays while the lock is held: its container
	// cannot be reported exited, nor paused.
	pz.mu.Lock()
	defer pz.mu.Unlock()
	if pz.h == nil || pz.asked {
		return ForkFrom{}, fmt.Errorf("executor: fork point of run %s: %w", runID, ErrNotLive)
	}
	name := ForkPointPrefix + strings.ToLower(rand.Text()) + "/" + SessionStateName
	pr, pw := io.Pipe()
	go func() {
		_, err := workspace.PackHome(ctx, p.dirs.Home, pw, workspace.PackOptions{Exclude: p.sessionExcludes})
		pw.CloseWithError(err)
	}()
	info, err := p.in.Persist.PutRunFile(ctx, p.ref, name, pr, "application/gzip")
	pr.CloseWithError(errors.Join(err, io.ErrClosedPipe))
	if err != nil {
		return ForkFrom{}, fmt.Errorf("executor: fork point of run %s: store its home: %w", runID, err)
	}
	return ForkFrom{State: &ForkState{Object: name, SHA256: info.SHA256}}, nil
}

// forkBaseDir is the executor-private directory (in plan.hostDir) where
// a fork's prepare copies the original workspace, the base of its change
// set, until the changes hook recorded it.
const forkBaseDir = "fork-base"

// copyForkBase copies a fork's original workspace (the tenant's persistent
// files and the task's workspace, as a run that starts afresh copies them)
// into forkBaseDir: its change set is against that, not against the
// parent's home it starts in. A failure costs only the change set.
func copyForkBase(ctx context.Context, p *plan) {
	dst := filepath.Join(p.hostDir, forkBaseDir)
	if err := os.MkdirAll(dst, 0o700); err != nil {
		p.log.Warn("the fork will have no change set: its base could not be made", "err", err)
		return
	}
	for _, dir := range []string{p.in.Paths.PersistentUserDir(p.ref.UserID), p.in.Task.WorkspaceDir} {
		if dir == "" || !dirExists(dir) {
			continue
		}
		if _, err := workspace.CopyTree(ctx, dir, dst, workspace.CopyOptions{}); err != nil {
			p.log.Warn("the fork will have no change set: copying its base failed", "dir", dir, "err", err)
			_ = os.RemoveAll(dst)
			return
		}
	}
}

// parentRun is the run the attestation names as the run's parent: the run
// it was forked from, else the run whose session it resumes.
func parentRun(r *model.TaskRun) string {
	if r.ParentRunID != "" {
		return r.ParentRunID
	}
	return r.PreviousRunID
}
