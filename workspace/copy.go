package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
)

// DefaultCopyWorkers is the number of files CopyTree copies in parallel when
// CopyOptions.Workers is zero. Small-file copies are dominated by syscall
// latency, so a few more workers than cores keeps the disk busy.
const DefaultCopyWorkers = 8

// reasonExists is the skip reason for entries kept because of KeepExisting.
const reasonExists = "already exists in destination; kept"

// CopyOptions controls CopyTree.
type CopyOptions struct {
	// Owner, when set and the process runs as root, becomes the owner of every
	// entry CopyTree creates. Without root, entries belong to the executor.
	Owner *Owner
	// KeepExisting leaves entries that already exist in dst untouched (each is
	// recorded in CopyStats.Skipped); otherwise they are replaced.
	KeepExisting bool
	// Workers bounds parallel file copies; zero means DefaultCopyWorkers.
	Workers int
	// Ledger, when set, bounds what is read from src as it does for Collect:
	// sparse files and second links to a hard-linked file are skipped, and
	// so are files past its total. Set it when src is the agent's.
	Ledger *Ledger
}

// CopyStats summarises a CopyTree call.
type CopyStats struct {
	// Files, Dirs and Symlinks count the entries created in dst.
	Files    int64 `json:"files"`
	Dirs     int64 `json:"dirs"`
	Symlinks int64 `json:"symlinks"`
	// Bytes is the total size of the file contents copied.
	Bytes int64 `json:"bytes"`
	// Skipped lists the entries left out, with the reason: the
	// first MaxSkips of them.
	Skipped []Skip `json:"skipped,omitempty"`
	// DroppedSkips counts the skipped entries not listed in Skipped because
	// it already held MaxSkips; len(Skipped)+DroppedSkips entries were skipped.
	DroppedSkips int64 `json:"dropped_skips,omitempty"`
}

// CopyTree copies the contents of src into the existing directory dst
// (typically a workspace or the user's persistent dir into a run's home).
//
// It copies regular files, directories and symlinks with their permission
// bits (set-id and sticky bits are dropped) and modification times. Symlinks
// are copied as links only when their target is relative and resolves inside
// src; others are skipped. FIFOs, sockets and devices, the contents of
// directories MaxDepth levels down and paths longer than MaxPathBytes are
// skipped. Every skip is recorded with its reason in CopyStats.Skipped (the
// first MaxSkips; the rest are counted in CopyStats.DroppedSkips). Hard links are copied as
// separate files, unless CopyOptions.Ledger reads each once. Nothing outside src is read and nothing outside dst written:
// both are accessed through os.Root and symlinks are never followed.
//
// File contents are copied by a bounded pool of workers with copy_file_range
// where the kernel supports it. On error dst may hold a partial copy.
func CopyTree(ctx context.Context, src, dst string, opts CopyOptions) (CopyStats, error) {
	srcTop, srcInfo, err := openTop(src)
	if err != nil {
		return CopyStats{}, fmt.Errorf("copy tree: source: %w", err)
	}
	defer srcTop.Close()
	dstTop, dstInfo, err := openTop(dst)
	if err != nil {
		return CopyStats{}, fmt.Errorf("copy tree: destination: %w; create it first", err)
	}
	defer dstTop.Close()
	if os.SameFile(srcInfo, dstInfo) {
		return CopyStats{}, fmt.Errorf("copy tree: %s and %s are the same directory", src, dst)
	}

	c := newCopier(ctx, srcTop, dstTop, opts)
	c.dstInfo = dstInfo
	walkErr := walkTree(c.ctx, srcTop, srcInfo, c)
	waitErr := c.group.Wait()
	if waitErr != nil && ctx.Err() == nil && errors.Is(walkErr, context.Canceled) {
		// A worker's failure stopped the walk: the cause is the worker's
		// error, not the cancellation it caused.
		walkErr = nil
	}
	if err := errors.Join(walkErr, waitErr); err != nil {
		return c.stats(), fmt.Errorf("copy tree %s to %s: %w", src, dst, err)
	}
	if err := c.fixDirs(); err != nil {
		return c.stats(), fmt.Errorf("copy tree %s to %s: %w", src, dst, err)
	}
	return c.stats(), nil
}

// dirFix is a directory whose mode and times are set after its content.
type dirFix struct {
	rel          string
	perm         fs.FileMode
	atime, mtime time.Time
}

type copier struct {
	ctx    context.Context
	group  *errgroup.Group
	srcTop *os.Root
	dstTop *os.Root
	// dstInfo identifies dst, so that a dst inside src is not copied into itself.
	dstInfo fs.FileInfo
	opts    CopyOptions
	chown   bool      // opts.Owner is set and the process is root
	stack   []*dirRef // destination directories matching the walk's depth
	fixes   []dirFix

	files, dirs, symlinks, bytes atomic.Int64

	mu    sync.Mutex
	skips skipList
}

func newCopier(ctx context.Context, srcTop, dstTop *os.Root, opts CopyOptions) *copier {
	group, gctx := errgroup.WithContext(ctx)
	workers := opts.Workers
	if workers <= 0 {
		workers = DefaultCopyWorkers
	}
	group.SetLimit(workers)
	top := newDirRef(dstTop)
	top.acquire() // CopyTree closes dstTop itself
	return &copier{
		ctx: gctx, group: group, srcTop: srcTop, dstTop: dstTop,
		opts: opts, chown: opts.Owner.chownable(), stack: []*dirRef{top},
	}
}

func (c *copier) stats() CopyStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CopyStats{
		Files:        c.files.Load(),
		Dirs:         c.dirs.Load(),
		Symlinks:     c.symlinks.Load(),
		Bytes:        c.bytes.Load(),
		Skipped:      c.skips.kept(),
		DroppedSkips: c.skips.dropped,
	}
}

func (c *copier) exclude(string) bool { return false }

func (c *copier) skip(rel, reason string) {
	c.mu.Lock()
	c.skips.add(rel, reason)
	c.mu.Unlock()
}

func (c *copier) dstDir() *dirRef { return c.stack[len(c.stack)-1] }

func (c *copier) enterDir(n node, _ *dirRef) (func() error, error) {
	if os.SameFile(n.info, c.dstInfo) {
		c.skip(n.rel, "the destination itself (not copied into itself)")
		return nil, nil
	}
	child, created, err := c.ensureDir(c.dstDir().root, n.name)
	if err != nil {
		return nil, fmt.Errorf("create directory %q: %w", n.rel, err)
	}
	if child == nil {
		c.skip(n.rel, reasonExists)
		return nil, nil
	}
	if created {
		c.dirs.Add(1)
		atime, mtime := fileTimes(n.info)
		c.fixes = append(c.fixes, dirFix{rel: n.rel, perm: n.info.Mode().Perm(), atime: atime, mtime: mtime})
	}
	ref := newDirRef(child)
	c.stack = append(c.stack, ref)
	return func() error {
		c.stack = c.stack[:len(c.stack)-1]
		ref.release()
		return nil
	}, nil
}

// ensureDir creates the directory name in parent, or merges into an existing
// one. It returns a nil Root when a non-directory in the way is kept.
func (c *copier) ensureDir(parent *os.Root, name string) (child *os.Root, created bool, err error) {
	err = parent.Mkdir(name, 0o700)
	created = err == nil
	if errors.Is(err, fs.ErrExist) {
		var keep bool
		created, keep, err = c.makeRoomForDir(parent, name)
		if keep {
			return nil, false, err
		}
	}
	if err != nil {
		return nil, false, err
	}
	if created && c.chown {
		if err := parent.Lchown(name, c.opts.Owner.UID, c.opts.Owner.GID); err != nil {
			return nil, false, err
		}
	}
	child, err = parent.OpenRoot(name)
	return child, created, err
}

// makeRoomForDir handles an existing entry where a directory is wanted: a
// directory is merged into; anything else is kept (KeepExisting) or replaced
// by a new directory.
func (c *copier) makeRoomForDir(parent *os.Root, name string) (created, keep bool, err error) {
	info, err := parent.Lstat(name)
	switch {
	case err != nil:
		return false, false, err
	case info.IsDir():
		return false, false, nil
	case c.opts.KeepExisting:
		return false, true, nil
	}
	if err := parent.RemoveAll(name); err != nil {
		return false, false, err
	}
	return true, false, parent.Mkdir(name, 0o700)
}

func (c *copier) file(n node) error {
	dst := c.dstDir()
	n.parent.acquire()
	dst.acquire()
	c.group.Go(func() error {
		defer n.parent.release()
		defer dst.release()
		return c.copyFile(n, dst.root)
	})
	return nil
}

func (c *copier) copyFile(n node, dst *os.Root) error {
	in, info, reason := openRegular(n)
	if reason != "" {
		c.skip(n.rel, reason)
		return nil
	}
	defer in.Close()
	if c.opts.Ledger != nil {
		if reason := c.opts.Ledger.admit(n.rel, info); reason != "" {
			c.skip(n.rel, reason)
			return nil
		}
	}
	out, err := c.create(dst, n.name, n.rel)
	if err != nil || out == nil {
		return err
	}
	written, err := io.Copy(out, in)
	if err == nil {
		err = c.finishFile(out, info)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		atime, mtime := fileTimes(info)
		err = dst.Chtimes(n.name, atime, mtime)
	}
	if err != nil {
		return fmt.Errorf("copy %q: %w", n.rel, err)
	}
	c.files.Add(1)
	c.bytes.Add(written)
	return nil
}

func (c *copier) finishFile(out *os.File, info fs.FileInfo) error {
	if c.chown {
		if err := out.Chown(c.opts.Owner.UID, c.opts.Owner.GID); err != nil {
			return err
		}
	}
	return out.Chmod(info.Mode().Perm())
}

// create makes a new file name in dir, never writing through an existing
// entry. It returns nil (and records a skip) when the entry is kept.
func (c *copier) create(dir *os.Root, name, rel string) (*os.File, error) {
	// O_NONBLOCK has no effect on a regular file but spares os.File four
	// fcntl calls per file toggling it for the poller.
	const flags = os.O_WRONLY | os.O_CREATE | os.O_EXCL | syscall.O_NONBLOCK
	f, err := dir.OpenFile(name, flags, 0o600)
	if !errors.Is(err, fs.ErrExist) {
		return f, err
	}
	if c.opts.KeepExisting {
		c.skip(rel, reasonExists)
		return nil, nil
	}
	if err := dir.RemoveAll(name); err != nil {
		return nil, err
	}
	return dir.OpenFile(name, flags, 0o600)
}

func (c *copier) symlink(n node, target string) error {
	if reason := symlinkReason(c.srcTop, n.rel, target); reason != "" {
		c.skip(n.rel, reason)
		return nil
	}
	dst := c.dstDir().root
	err := dst.Symlink(target, n.name)
	if errors.Is(err, fs.ErrExist) {
		if c.opts.KeepExisting {
			c.skip(n.rel, reasonExists)
			return nil
		}
		if err = dst.RemoveAll(n.name); err == nil {
			err = dst.Symlink(target, n.name)
		}
	}
	if err == nil && c.chown {
		err = dst.Lchown(n.name, c.opts.Owner.UID, c.opts.Owner.GID)
	}
	if err != nil {
		return fmt.Errorf("copy symlink %q: %w", n.rel, err)
	}
	c.symlinks.Add(1)
	return nil
}

// fixDirs applies the source directories' modes and times, deepest first so
// that setting a child's times does not disturb its parent's.
func (c *copier) fixDirs() error {
	for _, fix := range slices.Backward(c.fixes) {
		if err := c.dstTop.Chmod(fix.rel, fix.perm); err != nil {
			return err
		}
		if err := c.dstTop.Chtimes(fix.rel, fix.atime, fix.mtime); err != nil {
			return err
		}
	}
	return nil
}

// fileTimes returns the access and modification times recorded in info.
func fileTimes(info fs.FileInfo) (atime, mtime time.Time) {
	mtime = info.ModTime()
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return time.Unix(st.Atim.Unix()), mtime
	}
	return mtime, mtime
}
