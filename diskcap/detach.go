package diskcap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ImagePath is where Mount keeps the filesystem image for dir.
func ImagePath(dir string) string { return imagePath(dir) }

// Mounted reports whether a filesystem is mounted on dir.
func Mounted(dir string) (bool, error) {
	m, err := isMountPoint(dir)
	if err != nil {
		return false, fmt.Errorf("diskcap: %w", err)
	}
	return m, nil
}

// Detach unmounts dir's capped filesystem and keeps its image, so that a run
// kept for a later persist holds no mount and no loop device. The blocks the
// run does not use are first given back to the host (fstrim through the loop
// device punches holes in the image), so a kept image costs what the run
// stored, not its whole cap. A dir with nothing mounted is left as it is.
func Detach(dir string) error {
	mounted, err := isMountPoint(dir)
	if err != nil {
		return fmt.Errorf("diskcap: %w", err)
	}
	if !mounted {
		return nil
	}
	// Best effort: an image that cannot be trimmed is kept whole.
	_ = exec.Command("fstrim", dir).Run()
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("diskcap: umount %s: %w: %s", dir, err, out)
	}
	return awaitLoopDetached(imagePath(dir))
}

// awaitLoopDetached waits until no loop device is backed by img: the kernel
// detaches an auto-clearing loop device shortly after its last unmount, and
// until then the image cannot be mounted again.
func awaitLoopDetached(img string) error {
	for range 100 {
		if backed, err := loopBacked(img); err != nil || !backed {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("diskcap: a loop device still backs %s after unmounting it", img)
}

// loopBacked reports whether a loop device is backed by img.
func loopBacked(img string) (bool, error) {
	out, err := exec.Command("losetup", "-j", img).Output()
	if err != nil {
		return false, fmt.Errorf("diskcap: losetup -j %s: %w", img, err)
	}
	return len(bytes.TrimSpace(out)) > 0, nil
}

// Reattach mounts, read-only, the image Detach kept for dir back on dir so
// that its contents can be read again. release unmounts it and deletes the
// image (it discards the contents: persist them first). A dir that is still
// mounted is used as it is; a dir without an image returns an error wrapping
// fs.ErrNotExist.
func Reattach(ctx context.Context, dir string) (release func() error, err error) {
	release = sync.OnceValue(func() error { return Release(dir) })
	if mounted, err := isMountPoint(dir); err != nil {
		return nil, fmt.Errorf("diskcap: %w", err)
	} else if mounted {
		return release, nil
	}
	img := imagePath(dir)
	if _, err := os.Stat(img); err != nil {
		return nil, fmt.Errorf("diskcap: kept image of %s: %w", dir, err)
	}
	if err := awaitLoopDetached(img); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("diskcap: %w", err)
	}
	// noload: never replay the journal of an image whose writer died.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("diskcap: %w", err)
	}
	// Never abandoned for ctx: see Mount.
	o := mountOptions{readOnly: true, flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, data: "noload"}
	if out, err := mountImage(img, dir, o); err != nil {
		mountErr := fmt.Errorf("diskcap: mount kept image %s on %s: %w: %s", img, dir, err, out)
		if mounted, _ := isMountPoint(dir); mounted {
			// The kernel mounted it all the same: undo that, keep the image.
			if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
				return nil, errors.Join(mountErr, fmt.Errorf("diskcap: umount %s: %w: %s", dir, err, out))
			}
		}
		return nil, mountErr
	}
	return release, nil
}

// HasImage reports whether dir has an image made by Mount, mounted or kept.
func HasImage(dir string) bool {
	_, err := os.Stat(imagePath(dir))
	return !errors.Is(err, fs.ErrNotExist)
}
