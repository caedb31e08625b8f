package diskcap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/taskrun/taskrun/workspace"
)

// Keep turns dir, on which Mount put a capped filesystem, into a plain
// directory holding a copy of what the run left there, so that a run kept
// for inspection runs under the kernel's cap like every other and still
// holds no mount once it is over. unmount is the function Mount returned.
//
// The tree is the agent's, so the copy reads it as collection does (see
// workspace.Ledger): at most limit bytes in total, sparse files and second
// links to a hard-linked file skipped, symlinks leaving the tree and special
// files skipped; the returned stats list what was left out. The copy is
// staged next to dir and put in its place only after the unmount; on an
// error before that, dir stays mounted and untouched. When nothing is
// mounted on dir (a run dir capped by the watchdog), Keep only calls
// unmount and leaves dir as it is.
func Keep(ctx context.Context, dir string, unmount func() error, limit int64) (workspace.CopyStats, error) {
	mounted, err := isMountPoint(dir)
	if err != nil {
		return workspace.CopyStats{}, fmt.Errorf("diskcap: keep %s: %w", dir, err)
	}
	if !mounted {
		return workspace.CopyStats{}, unmount()
	}
	info, err := os.Stat(dir)
	if err != nil {
		return workspace.CopyStats{}, fmt.Errorf("diskcap: keep %s: %w", dir, err)
	}
	staging := filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".kept")
	if err := os.Mkdir(staging, 0o700); err != nil {
		return workspace.CopyStats{}, fmt.Errorf("diskcap: keep %s: %w", dir, err)
	}
	stats, err := workspace.CopyTree(ctx, dir, staging, workspace.CopyOptions{Ledger: workspace.NewLedger(limit)})
	if err == nil {
		err = os.Chmod(staging, info.Mode().Perm())
	}
	if err != nil {
		return stats, errors.Join(fmt.Errorf("diskcap: keep %s: %w", dir, err), os.RemoveAll(staging))
	}
	if err := unmount(); err != nil {
		return stats, errors.Join(fmt.Errorf("diskcap: keep %s: %w", dir, err), os.RemoveAll(staging))
	}
	if err := os.Remove(dir); err != nil {
		return stats, fmt.Errorf("diskcap: keep %s: the copy is in %s: %w", dir, staging, err)
	}
	if err := os.Rename(staging, dir); err != nil {
		return stats, fmt.Errorf("diskcap: keep %s: the copy is in %s: %w", dir, staging, err)
	}
	return stats, nil
}
