package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/taskrun/taskrun/helpers/podhelper"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workspace"
)

// writeFillStream writes the Spec's mounts as a fill stream: a directory as
// a PackHome archive (regular files, directories and safe symlinks; sockets
// and other special files stay on the host), a file as its bytes.
func writeFillStream(ctx context.Context, w io.Writer, mounts []sandbox.Mount) error {
	sw := podhelper.NewStreamWriter(w)
	for i, m := range mounts {
		info, err := os.Stat(m.Source)
		if err != nil {
			return fmt.Errorf("mount source %s: %w", m.Source, err)
		}
		name := podhelper.SectionName(i)
		switch {
		case info.IsDir():
			err = sw.Section(podhelper.KindDir, name, 0, func(w io.Writer) error {
				_, err := workspace.PackHome(ctx, m.Source, w, workspace.PackOptions{})
				return err
			})
		case info.Mode().IsRegular():
			err = sw.Section(podhelper.KindFile, name, uint32(info.Mode().Perm()), func(w io.Writer) error {
				f, err := os.Open(m.Source)
				if err != nil {
					return err
				}
				defer f.Close()
				_, err = io.Copy(w, f)
				return err
			})
		default:
			err = fmt.Errorf("mount source %s is a %s; only directories and regular files cross to a Pod", m.Source, info.Mode().Type())
		}
		if err != nil {
			return err
		}
	}
	return sw.Close()
}

// outPrefix names the staging directory of an archive copied out.
const outPrefix = ".taskrun-pod-out-"

// syncInto makes dir hold exactly the PackHome archive on r: the archive is
// extracted safely (workspace.UnpackHome: no path escapes, no special files,
// bounded) into a staging directory inside dir, then every entry of dir
// except sockets (the executor's own, such as the model gateway's) is
// replaced by the staged ones. Extracted files belong to dir's owner.
//
// The archive's content is bounded by volumeBytes, the size of the data
// volume it was packed from: the Pod cannot have stored more. That bound
// is the whole budget, so no compression ratio is refused under it (a
// large, repetitive file the run legitimately wrote compresses far beyond
// any ratio cap); past it the copy fails with workspace.ErrLimitExceeded
// and dir is left as it was.
func syncInto(ctx context.Context, r io.Reader, dir string, volumeBytes int64) error {
	info, err := os.Stat(dir)
	if err != nil {
		return err
	}
	var owner *workspace.Owner
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		owner = &workspace.Owner{UID: int(st.Uid), GID: int(st.Gid)}
	}
	staging, err := os.MkdirTemp(dir, outPrefix)
	if err != nil {
		return err
	}
	defer os.RemoveAll(staging)
	if err := os.Remove(staging); err != nil {
		return err
	}
	limits := workspace.UnpackLimits{MaxBytes: volumeBytes, RatioGrace: volumeBytes}
	if _, err := workspace.UnpackHome(ctx, r, staging, workspace.UnpackOptions{Owner: owner, Limits: limits}); err != nil {
		return err
	}
	old, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range old {
		if strings.HasPrefix(e.Name(), outPrefix) || e.Type()&fs.ModeSocket != 0 {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	staged, err := os.ReadDir(staging)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range staged {
		dst := filepath.Join(dir, e.Name())
		if _, err := os.Lstat(dst); err == nil {
			continue // a socket kept above: never replaced by the Pod's file
		}
		if err := os.Rename(filepath.Join(staging, e.Name()), dst); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
