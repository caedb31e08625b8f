package executor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/taskrun/taskrun/agentmd"
	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workspace"
)

// workspaceHook fills the run directory (prepare): the home (the user's
// persistent files and the task's workspace, or the resumed session), the
// prompt and AGENTS.md.
type workspaceHook struct {
	p  *plan
	wd *workdir
}

func (h *workspaceHook) name() string { return "workspace" }

func (h *workspaceHook) prestart(ctx context.Context, _ *prestartRequest, _ *prestartResponse) error {
	return prepare(ctx, h.p, h.wd)
}

// prepare materializes the run directory: the user's persistent files and
// the workspace or the resumed session, the prompt and AGENTS.md. The
// engine may be creating the container meanwhile: it reads the directory
// only when the container starts.
func prepare(ctx context.Context, p *plan, wd *workdir) error {
	if err := os.MkdirAll(p.hostDir, 0o700); err != nil {
		return fmt.Errorf("create executor directory: %w", err)
	}
	stopMaterialize := p.timings.Start(timings.Materialize)
	defer stopMaterialize()
	if rs := p.in.restore; rs != nil {
		if rs.fork {
			// A fork's change set is against the original workspace.
			copyForkBase(ctx, p)
		}
		// A restored run's home is the one it was paused with, stored as
		// its session state when it paused; a fork's is its parent's.
		if err := restoreHome(ctx, p, rs, wd.owner); err != nil {
			return diskcap.Explain(p.dirs.Dir, err)
		}
	} else if prev := p.in.Run.PreviousRunID; prev != "" {
		// The previous run's home already holds the persistent files and the
		// workspace as that run left them.
		if err := restoreSession(ctx, p, prev, wd.owner); err != nil {
			return diskcap.Explain(p.dirs.Dir, err)
		}
	} else if err := materializeHome(ctx, p, wd.owner); err != nil {
		return diskcap.Explain(p.dirs.Dir, err)
	}
	stopMaterialize()
	if err := os.WriteFile(filepath.Join(p.dirs.Dir, model.PromptFileName), []byte(p.in.Task.Prompt), 0o644); err != nil {
		return fmt.Errorf("write prompt: %w", err)
	}
	instructions := agentmd.InstructionsDir(p.dirs.Home, p.in.Task.WorkspaceDir, p.in.Run.PreviousRunID != "" || p.in.restore != nil)
	if err := agentmd.WriteRunAgentsMd(p.dirs.Dir, instructions); err != nil {
		return fmt.Errorf("write AGENTS.md: %w", err)
	}
	return nil
}

// materializeHome copies the user's persistent files, then the task's
// workspace, into home, owned by owner.
func materializeHome(ctx context.Context, p *plan, owner workspace.Owner) error {
	opts := workspace.CopyOptions{Owner: &owner}
	if dir := p.in.Paths.PersistentUserDir(p.ref.UserID); dirExists(dir) {
		if _, err := workspace.CopyTree(ctx, dir, p.dirs.Home, opts); err != nil {
			return fmt.Errorf("copy persistent user files: %w", err)
		}
	}
	if dir := p.in.Task.WorkspaceDir; dir != "" {
		if _, err := workspace.CopyTree(ctx, dir, p.dirs.Home, opts); err != nil {
			return fmt.Errorf("copy workspace %s: %w", dir, err)
		}
	}
	return nil
}

// restoreSession unpacks the previous run's session state into home, owned
// by owner. A rejected archive entry fails the run: a partial restore is
// never used.
func restoreSession(ctx context.Context, p *plan, prevRunID string, owner workspace.Owner) error {
	rc, err := p.in.Persist.OpenRunFile(ctx, p.ref.WithRun(prevRunID), SessionStateName)
	if err != nil {
		return fmt.Errorf("fetch session state of run %s: %w", prevRunID, err)
	}
	defer rc.Close()
	opts := workspace.UnpackOptions{Owner: &owner}
	if _, err := workspace.UnpackHome(ctx, rc, p.dirs.Home, opts); err != nil {
		return fmt.Errorf("restore session state of run %s: %w", prevRunID, err)
	}
	return nil
}

// restoreHome unpacks the home a restored run or fork starts in: the
// checked local copy of its state when there is one, else the stored
// session state of the run it starts from.
func restoreHome(ctx context.Context, p *plan, rs *restore, owner workspace.Owner) error {
	if rs.statePath == "" {
		return restoreSession(ctx, p, rs.from, owner)
	}
	f, err := os.Open(rs.statePath)
	if err != nil {
		return fmt.Errorf("restore the home of run %s: %w", rs.from, err)
	}
	defer f.Close()
	if _, err := workspace.UnpackHome(ctx, f, p.dirs.Home, workspace.UnpackOptions{Owner: &owner}); err != nil {
		return fmt.Errorf("restore the home of run %s: %w", rs.from, err)
	}
	return nil
}

func dirExists(dir string) bool {
	info, err := os.Stat(dir)
	return err == nil && info.IsDir()
}
