package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workspace"
)

// ErrWorkspaceMismatch is wrapped by the error for a workspace tar whose
// size or SHA-256 is not what the assignment says.
var ErrWorkspaceMismatch = errors.New("workspace tar does not match the assignment")

// fetchWorkspace downloads the workspace tar into dir, checks its size and
// SHA-256 against obj before reading a byte of it as an archive, and unpacks
// it with the safe unpacker into dir/home, which it returns.
func (w *Worker) fetchWorkspace(ctx context.Context, obj *workerclient.StoredObject, dir string) (string, error) {
	if w.cfg.Workspaces == nil {
		return "", errors.New("this worker has no shared store (--store) to read workspaces from")
	}
	if obj.Size < 0 || obj.Size > w.cfg.MaxWorkspaceBytes {
		return "", fmt.Errorf("size %d is over this worker's cap of %d bytes", obj.Size, w.cfg.MaxWorkspaceBytes)
	}
	want := strings.ToLower(strings.TrimPrefix(obj.SHA256, "sha256:"))
	if len(want) != sha256.Size*2 {
		return "", fmt.Errorf("%w: sha256 %q is not a hex SHA-256", ErrWorkspaceMismatch, obj.SHA256)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	tarPath := filepath.Join(dir, "workspace.tar.gz")
	if err := download(ctx, w.cfg.Workspaces, obj.Key, tarPath, obj.Size, want); err != nil {
		return "", err
	}
	f, err := os.Open(tarPath)
	if err != nil {
		return "", err
	}
	defer f.Close()
	home := filepath.Join(dir, "home")
	if _, err := workspace.UnpackHome(ctx, f, home, workspace.UnpackOptions{}); err != nil {
		return "", err
	}
	return home, os.Remove(tarPath)
}

// download copies key to path, reading at most size+1 bytes, and checks the
// size and digest.
func download(ctx context.Context, store WorkspaceStore, key, path string, size int64, wantHex string) error {
	rc, err := store.Open(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(rc, size+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("download: %w", err)
	}
	if n != size {
		return fmt.Errorf("%w: %d bytes stored, %d expected", ErrWorkspaceMismatch, n, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != wantHex {
		return fmt.Errorf("%w: sha256 %s, %s expected", ErrWorkspaceMismatch, got, wantHex)
	}
	return nil
}
