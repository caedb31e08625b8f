package runindex

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/workspace"
)

// HomePrefix starts an OpenFile path that names a file of the run's final
// home, read out of its stored session state.
const HomePrefix = "home/"

// ErrNoObject is wrapped when a run stored no object of the kind asked for.
var ErrNoObject = errors.New("runindex: the run stored no such object")

// openKey opens key after checking that it lies in the run's tenant.
func openKey(ctx context.Context, store *persist.Store, rec *Record, what, key string) (io.ReadCloser, error) {
	if key == "" {
		return nil, fmt.Errorf("%w: run %s has no %s", ErrNoObject, rec.RunID, what)
	}
	prefix, err := persist.TenantPrefix(rec.UserID)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(key, prefix) {
		return nil, fmt.Errorf("runindex: run %s names %s key %q outside its tenant", rec.RunID, what, key)
	}
	rc, err := store.Open(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("runindex: open %s of run %s: %w", what, rec.RunID, err)
	}
	return rc, nil
}

// OpenLog opens the run's stdout log, or its stderr log.
func OpenLog(ctx context.Context, store *persist.Store, rec *Record, stderr bool) (io.ReadCloser, error) {
	if stderr {
		return openKey(ctx, store, rec, "stderr log", rec.Keys.Stderr)
	}
	return openKey(ctx, store, rec, "output log", rec.Keys.Log)
}

// OpenPatch opens the run's changes.patch.
func OpenPatch(ctx context.Context, store *persist.Store, rec *Record) (io.ReadCloser, error) {
	return openKey(ctx, store, rec, "patch", rec.Keys.Patch)
}

// OpenChanges opens the run's changes.json.
func OpenChanges(ctx context.Context, store *persist.Store, rec *Record) (io.ReadCloser, error) {
	return openKey(ctx, store, rec, "change list", rec.Keys.Changes)
}

// OpenFile opens one file of a run, named by a path relative to the run:
//
//   - "home/<path>": a file of the run's final home, taken out of the stored
//     session state (unpacked with workspace.UnpackHome's checks and caps
//     into a temporary directory that Close removes); a symlink is refused,
//     never followed;
//   - any other path, such as "artifacts/<path>", "output/result.md" or
//     "changes.json": the run's object of that name.
func OpenFile(ctx context.Context, store *persist.Store, rec *Record, p string) (io.ReadCloser, error) {
	if err := persist.ValidateRelPath(p); err != nil {
		return nil, err
	}
	if rel, ok := strings.CutPrefix(p, HomePrefix); ok {
		return openHomeFile(ctx, store, rec, rel)
	}
	prefix, err := persist.RunPrefix(rec.Ref())
	if err != nil {
		return nil, err
	}
	rc, err := openKey(ctx, store, rec, p, prefix+p)
	if errors.Is(err, persist.ErrNotFound) {
		return nil, fmt.Errorf("%w: see the run's stored objects with `taskrun inspect %s`", err, rec.RunID)
	}
	return rc, err
}

// openHomeFile unpacks the run's session state and opens rel in it.
func openHomeFile(ctx context.Context, store *persist.Store, rec *Record, rel string) (io.ReadCloser, error) {
	state, err := openKey(ctx, store, rec, "session state", rec.Keys.State)
	if err != nil {
		return nil, err
	}
	defer state.Close()
	tmp, err := os.MkdirTemp("", "taskrun-home-")
	if err != nil {
		return nil, err
	}
	cleanup := func() { os.RemoveAll(tmp) }
	home := filepath.Join(tmp, "home")
	if _, err := workspace.UnpackHome(ctx, state, home, workspace.UnpackOptions{}); err != nil {
		cleanup()
		return nil, fmt.Errorf("runindex: unpack session state of %s: %w", rec.RunID, err)
	}
	root, err := os.OpenRoot(home)
	if err != nil {
		cleanup()
		return nil, err
	}
	defer root.Close()
	info, err := root.Lstat(rel)
	if err != nil {
		cleanup()
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s is not in run %s's final home (the session state leaves out its excludes)", persist.ErrNotFound, rel, rec.RunID)
		}
		return nil, err
	}
	if !info.Mode().IsRegular() {
		cleanup()
		if info.Mode()&fs.ModeSymlink != 0 {
			target, _ := root.Readlink(rel)
			return nil, fmt.Errorf("runindex: %s in run %s's home is a symlink to %q; copy its target instead", rel, rec.RunID, target)
		}
		return nil, fmt.Errorf("runindex: %s in run %s's home is not a regular file", rel, rec.RunID)
	}
	f, err := root.Open(rel)
	if err != nil {
		cleanup()
		return nil, err
	}
	return &tempFile{File: f, cleanup: cleanup}, nil
}

// tempFile removes its temporary directory when closed.
type tempFile struct {
	*os.File
	cleanup func()
}

func (t *tempFile) Close() error {
	err := t.File.Close()
	t.cleanup()
	return err
}
