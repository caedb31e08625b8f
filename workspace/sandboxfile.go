package workspace

import (
	"fmt"
	"io/fs"
	"os"
	"path"
)

// CreateSandboxFile creates the file rel (slash-separated) under root, with
// any missing parent directories, for the sandbox user: owned by owner when
// the executor is root, world-writable directories otherwise (see
// CreateRunDirs). The file is opened for appending and must not exist yet.
//
// Everything goes through os.Root, so a symlink planted under root (by an
// earlier, restored session) cannot redirect the file outside it.
func CreateSandboxFile(root, rel string, owner Owner) (*os.File, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", rel, err)
	}
	defer r.Close()
	dir := path.Dir(rel)
	if err := r.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := r.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", rel, err)
	}
	if err := shareWithSandbox(r, dir, f, owner); err != nil {
		f.Close()
		return nil, fmt.Errorf("create %s: %w", rel, err)
	}
	return f, nil
}

// shareWithSandbox hands the directories of dir (each element) and f to owner,
// or opens them to everyone when the executor cannot chown.
func shareWithSandbox(r *os.Root, dir string, f *os.File, owner Owner) error {
	dirMode, fileMode := sharedSandboxDirMode, fs.FileMode(0o666)
	for d := dir; d != "." && d != "/"; d = path.Dir(d) {
		if isRoot() {
			if err := r.Lchown(d, owner.UID, owner.GID); err != nil {
				return err
			}
			dirMode = ownedSandboxDirMode
		}
		if err := r.Chmod(d, dirMode); err != nil {
			return err
		}
	}
	if isRoot() {
		if err := f.Chown(owner.UID, owner.GID); err != nil {
			return err
		}
		fileMode = 0o644
	}
	return f.Chmod(fileMode)
}
