package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"

	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/timings"
)

// changesHook is the run's change set:
//
//	Prestart  the starting tree is recorded (after the home is prepared)
//	Collect   the change set against it is computed and stored (also for
//	          a kept run, from its local copy)
type changesHook struct {
	p *plan
}

func (h *changesHook) name() string { return "changes" }

// prestart records the starting tree.
func (h *changesHook) prestart(ctx context.Context, _ *prestartRequest, _ *prestartResponse) error {
	h.p.timings.Time(timings.Snapshot, func() error { snapshotChanges(ctx, h.p); return nil })
	return nil
}

// snapshotChanges records the run's starting tree (the workspace as copied
// in, or the restored session) for the change set. A failure costs only the
// change set, never the run.
func snapshotChanges(ctx context.Context, p *plan) {
	opts := changeOptions(p)
	home := p.dirs.Home
	if p.in.restore != nil && p.in.restore.fork {
		// A fork's base is the original workspace (copyForkBase).
		home = filepath.Join(p.hostDir, forkBaseDir)
		defer os.RemoveAll(home)
		if !dirExists(home) {
			p.log.Warn("the fork will have no change set: its base was not copied")
			return
		}
		opts.Workspace = p.in.Task.WorkspaceDir
	} else if p.in.Run.PreviousRunID == "" {
		// A resumed run starts from its session, not from the workspace's
		// base commit.
		opts.Workspace = p.in.Task.WorkspaceDir
	}
	if err := changeset.Snapshot(ctx, home, filepath.Join(p.hostDir, changesBaseDir), opts); err != nil {
		p.log.Warn("the run will have no change set: recording its starting tree failed", "err", err)
	}
}

// changeOptions are the run's change-set options but its workspace: its
// excludes with the image's.
func changeOptions(p *plan) changeset.Options {
	opts := changeset.Options{Exclude: p.in.ChangeExcludes}
	if img, err := changeset.ImageExcludes(p.image.Labels); err != nil {
		p.log.Warn("the image's change-set excludes are ignored", "err", err)
	} else {
		opts.Exclude = changeset.WithImageExcludes(opts.Exclude, img)
	}
	return opts
}

// changeResult is what collect stored of the change set.
type changeResult struct {
	set         *changeset.Set
	patch, list persist.ObjectInfo
}

// collect computes the change set of the run's home against the starting
// tree and stores changes.patch and changes.json. A run whose starting tree
// was not recorded, or whose tree cannot be compared, has none (logged); a
// failed upload is a persist error like any other.
func (h *changesHook) collect(ctx context.Context, req *collectRequest, resp *collectResponse) error {
	p := h.p
	patchPath := filepath.Join(p.hostDir, ChangesPatchName)
	pf, err := os.OpenFile(patchPath, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer pf.Close()
	set, err := changeset.Compute(ctx, filepath.Join(p.hostDir, changesBaseDir), p.dirs.Home, pf)
	if err != nil {
		p.log.Warn("no change set for this run", "err", err)
		return nil
	}
	if _, err := pf.Seek(0, io.SeekStart); err != nil {
		return err
	}
	list, err := json.Marshal(set)
	if err != nil {
		return err
	}
	res := &changeResult{set: set}
	if res.patch, err = req.Put(ctx, ChangesPatchName, pf, "text/x-diff; charset=utf-8"); err != nil {
		return err
	}
	if res.list, err = req.Put(ctx, ChangesListName, bytes.NewReader(list), "application/json"); err != nil {
		return err
	}
	resp.Changes = res
	p.log.Info("change set", "files", set.Summary.Files, "patch_bytes", set.Summary.PatchBytes, "tree_hash", set.TreeHash)
	return nil
}
