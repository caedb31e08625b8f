// Package diskcap caps the disk space a run can use through its bind-mounted
// run dir, so an agent cannot fill the host disk through /taskrun.
//
// Two mechanisms, in order of preference:
//
//   - Mount: a per-run ext4 filesystem in a sparse image file, loop-mounted
//     (nosuid,nodev) on the run dir. The kernel enforces the cap: writes,
//     fallocate (with or without FALLOC_FL_KEEP_SIZE) and page faults on a
//     mapped sparse file fail with ENOSPC inside the container past it, and
//     the host loses at most the image's size: overshoot 0. It needs root,
//     mkfs.ext4 and loop devices; on this project's build machines (root,
//     Debian, /dev/loop*) all are present and `mount -o loop` works. Where
//     any is missing it returns ErrUnsupported. The image is attached to a
//     loop device and mounted in-process (mount(8) only on kernels before
//     5.8) and, WithTemplates, filled from a pre-formatted template instead
//     of being formatted by mkfs.ext4 each time. A run kept for inspection
//     runs under Mount too and is turned into a plain directory afterwards
//     by Keep, which copies out only what was allocated. Overlay2 quotas
//     (--storage-opt size) are no alternative: they need XFS with pquota and
//     do not cover bind mounts at all.
//   - Watch: a watchdog that polls the run dir's usage (allocated blocks,
//     hard links once) with a bounded, du-like walk every DefaultInterval
//     and calls back once when the cap is exceeded, so the caller can stop
//     the run. It works everywhere but is after the fact: a writer
//     overshoots the cap by what it writes in one interval (about 250 ms of
//     the disk's write bandwidth), and a single fallocate allocates all it
//     asks for before any poll can see it, which no watchdog can bound. It
//     is the fallback where Mount is unsupported (not root, no loop
//     devices): there the cap is best effort, and hosts that run untrusted
//     agents should run the executor as root with loop devices.
package diskcap

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// ErrUnsupported is returned by Mount when loop-mounted filesystems cannot be
// used here (not root, no mkfs.ext4, no loop device).
var ErrUnsupported = errors.New("diskcap: loop-mounted filesystem not supported here")

// ErrNotEmpty is returned by Mount for a run dir that already has content,
// which the mount would hide.
var ErrNotEmpty = errors.New("diskcap: run dir is not empty; mount the cap before materializing the run")

// ErrInUse is returned by Mount when another Mount of the same dir holds its
// image: two runs raced for one run dir. The other run's image is untouched.
var ErrInUse = errors.New("the run dir is being capped by another run")

// ImageOverhead bounds what the host allocates for a cap's image beyond its
// size: the image file's own extent tree. The host holds at most the cap plus
// ImageOverhead for a mounted run dir.
const ImageOverhead = 64 << 10

// MinSize is the smallest cap Mount accepts (ext4 needs room for metadata).
const MinSize = 8 << 20

// Mount creates a sparse image of size bytes (under an opaque name in the
// images directory, see WithImages; else next to dir as "."+base+
// ".diskcap.img"), formats it ext4 and loop-mounts it on dir, which must exist
// and be empty. The mounted root gets dir's owner and mode. unmount unmounts
// and deletes the image (calling it again returns the first result): it
// discards the run dir's contents, so persist them first.
func Mount(ctx context.Context, dir string, size int64, opts ...Option) (unmount func() error, err error) {
	var cfg mountConfig
	for _, o := range opts {
		o(&cfg)
	}
	if size < MinSize {
		return nil, fmt.Errorf("diskcap: size %d is below the minimum %d bytes", size, MinSize)
	}
	if err := supported(); err != nil {
		return nil, err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("diskcap: %w", err)
	}
	if entries, err := os.ReadDir(dir); err != nil {
		return nil, fmt.Errorf("diskcap: %w", err)
	} else if len(entries) > 0 {
		return nil, ErrNotEmpty
	}
	if mounted, err := isMountPoint(dir); err != nil {
		return nil, fmt.Errorf("diskcap: %w", err)
	} else if mounted {
		return nil, fmt.Errorf("diskcap: %w: %s is already a mount point", ErrInUse, dir)
	}
	img, err := claimImage(cfg, dir)
	if err != nil {
		return nil, err
	}
	if err := makeImage(img, size); err != nil {
		if !errors.Is(err, ErrInUse) {
			forgetImage(dir, img)
		}
		return nil, err
	}
	fromTemplate, err := format(ctx, cfg, img, size)
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("diskcap: %w", ctx.Err())
	}
	if err != nil {
		os.Remove(img)
		forgetImage(dir, img)
		return nil, err
	}
	// The mount is never abandoned for ctx: a mount made after the caller
	// gave up would be left for nobody to unmount. noinit_itable: the image
	// was just allocated, so its inode tables already read as zeros; zeroing
	// them again in the background would only make the unmount at the run's
	// end wait for those writes.
	o := mountOptions{flags: syscall.MS_NOSUID | syscall.MS_NODEV, data: "noinit_itable"}
	out, err := mountImage(img, dir, o)
	if fromTemplate && errors.Is(err, errMountRefused) {
		// The kernel refused an image copied from the template: the next
		// Mount makes the template again, and this one formats its image
		// itself. (A loop device that could not be had says nothing of
		// the template.)
		dropTemplate(cfg, size)
		if ferr := mkfs(ctx, img); ferr == nil {
			out, err = mountImage(img, dir, o)
		}
	}
	if err != nil {
		return nil, undoFailedMount(dir, img, err, out)
	}
	var once sync.Once
	var unmountErr error
	unmount = func() error {
		once.Do(func() {
			if err := unmountBusy(dir); err != nil {
				unmountErr = err
				return
			}
			unmountErr = os.Remove(img)
			forgetImage(dir, img)
		})
		return unmountErr
	}
	if err := adoptRoot(dir, fi); err != nil {
		return nil, errors.Join(err, unmount())
	}
	return unmount, nil
}

// undoFailedMount cleans up after a mount of img on dir that reported
// failure (mountErr, with mount(8)'s output where it was used): the kernel
// may have mounted it all the same (mount(8) failing or dying after its
// mount(2) returned), so a filesystem found on dir is unmounted before the
// image is deleted. The
// image is never deleted under a live mount: when the unmount fails, both
// stay and the error says so. The error wraps ErrUnsupported only when
// nothing was mounted.
func undoFailedMount(dir, img string, mountErr error, out []byte) error {
	cause := fmt.Errorf("%w: mount -o loop %s: %w: %s", ErrUnsupported, dir, mountErr, out)
	mounted, err := isMountPoint(dir)
	if err != nil {
		return errors.Join(cause, fmt.Errorf("diskcap: %w", err))
	}
	if mounted {
		// Something was mounted: the host does support loop mounts.
		cause = fmt.Errorf("diskcap: mount -o loop %s: %w: %s", dir, mountErr, out)
		if err := unmountBusy(dir); err != nil {
			return errors.Join(cause, fmt.Errorf("diskcap: after a failed mount (its image %s is kept): %w", img, err))
		}
		if err := awaitLoopDetached(img); err != nil {
			return errors.Join(cause, err)
		}
	}
	if err := os.Remove(img); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return errors.Join(cause, fmt.Errorf("diskcap: %w", err))
	}
	forgetImage(dir, img)
	return cause
}

// Release undoes a Mount on dir made by another process (an executor that
// has since exited): it unmounts dir if a filesystem is mounted there and
// deletes the image. It discards the mounted contents, and is a no-op for a
// dir with nothing mounted and no image.
func Release(dir string) error {
	mounted, err := isMountPoint(dir)
	if err != nil {
		return fmt.Errorf("diskcap: %w", err)
	}
	if mounted {
		if err := unmountBusy(dir); err != nil {
			return err
		}
	}
	img := imagePath(dir)
	if mounted {
		if err := awaitLoopDetached(img); err != nil {
			return err
		}
	}
	if err := os.Remove(img); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("diskcap: %w", err)
	}
	forgetImage(dir, img)
	return nil
}

// Unmounting a run dir is retried while the kernel says it is busy: a
// container being created anywhere on the host holds a copy of every host
// mount in its new mount namespace until it has pivoted into its own root,
// which is a matter of milliseconds.
var (
	busyRetries = 100
	busyWait    = 50 * time.Millisecond
)

// unmountBusy unmounts dir (a loop device set up by mount -o loop is freed
// with it), retrying for up to busyRetries × busyWait while it is busy. A
// mount still busy after that (on a loaded host, containers are created all
// the time) is detached lazily: it leaves the host's namespace at once, and
// the kernel frees it when the last namespace holding a copy lets go. Only a
// run's files that were already persisted or kept are under it.
func unmountBusy(dir string) error {
	for i := 0; ; i++ {
		err := syscall.Unmount(dir, 0)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return fmt.Errorf("diskcap: umount %s: %w", dir, err)
		}
		if i >= busyRetries {
			if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
				return fmt.Errorf("diskcap: umount %s: busy, and detaching it failed: %w", dir, err)
			}
			return nil
		}
		time.Sleep(busyWait)
	}
}

// isMountPoint reports whether dir is on another device than its parent.
func isMountPoint(dir string) (bool, error) {
	var st, parent syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	if err := syscall.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

func supported() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root", ErrUnsupported)
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrUnsupported, tool, err)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("%w: no loop devices: %w", ErrUnsupported, err)
	}
	return nil
}

// makeImage creates the image file img, fully allocated to size bytes.
func makeImage(img string, size int64) error {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, fs.ErrExist) {
		// Another run is capping this dir: its image is not ours to remove.
		return fmt.Errorf("diskcap: %w: %s exists", ErrInUse, img)
	}
	if err != nil {
		return fmt.Errorf("diskcap: create image: %w", err)
	}
	// The image is fully allocated, so the run's writes can never fail
	// (or be dropped by the loop device) because the host filled up: a run
	// admitted with Admit owns its cap. Where allocation is unsupported the
	// image is sparse.
	err = syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, syscall.EOPNOTSUPP) {
		err = f.Truncate(size)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(img)
		return fmt.Errorf("diskcap: allocate image: %w", err)
	}
	return nil
}

// adoptRoot gives the new filesystem's root the owner and mode of the dir it
// covers and removes lost+found, so the run sees the dir it expects.
func adoptRoot(dir string, was os.FileInfo) error {
	if err := os.Remove(filepath.Join(dir, "lost+found")); err != nil {
		return fmt.Errorf("diskcap: %w", err)
	}
	if st, ok := was.Sys().(*syscall.Stat_t); ok {
		if err := os.Chown(dir, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("diskcap: %w", err)
		}
	}
	if err := os.Chmod(dir, was.Mode().Perm()); err != nil {
		return fmt.Errorf("diskcap: %w", err)
	}
	return nil
}

// measure is Usage; tests replace it to make a tree unmeasurable.
var measure = Usage

// DefaultInterval is how often Watch should poll: short enough that a
// writer's overshoot stays a fraction of a second of its bandwidth, long
// enough that the walk's cost (bounded by MaxEntries) stays small.
const DefaultInterval = 250 * time.Millisecond

// ErrUnmeasurable is returned by Watch, after it called over, when the
// directory's usage could not be measured.
var ErrUnmeasurable = errors.New("diskcap: usage cannot be measured")

// MaxEntries bounds Usage's walk.
const MaxEntries = 1_000_000

// ErrTooManyFiles is returned by Usage when dir holds more than MaxEntries
// entries; Watch treats it as over the cap (inode exhaustion is abuse too).
var ErrTooManyFiles = errors.New("diskcap: too many files to measure")

// Usage returns the bytes of disk dir's tree occupies (allocated blocks,
// hard links counted once, symlinks not followed), walking at most
// MaxEntries entries.
func Usage(dir string) (int64, error) {
	var used int64
	seen := map[[2]uint64]bool{}
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // deleted while walking
			}
			return err
		}
		if n++; n > MaxEntries {
			return ErrTooManyFiles
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			used += info.Size()
			return nil
		}
		if st.Nlink > 1 {
			key := [2]uint64{uint64(st.Dev), st.Ino}
			if seen[key] {
				return nil
			}
			seen[key] = true
		}
		used += st.Blocks * 512
		return nil
	})
	return used, err
}

// Watch polls dir's usage every interval and calls over once, with the usage
// measured, when it exceeds limit (or the tree is too large to measure); then
// it returns nil. When dir cannot be measured it also calls over, and returns
// an error wrapping ErrUnmeasurable. It returns ctx's error when ctx ends
// first.
func Watch(ctx context.Context, dir string, limit int64, interval time.Duration, over func(used int64)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		used, err := measure(dir)
		switch {
		case errors.Is(err, ErrTooManyFiles) || (err == nil && used > limit):
			over(used)
			return nil
		case err != nil:
			// Fail closed: a tree the watchdog cannot measure (an unreadable
			// directory planted by the run) is treated as over the cap.
			over(used)
			return fmt.Errorf("%w: %s: %w", ErrUnmeasurable, dir, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
