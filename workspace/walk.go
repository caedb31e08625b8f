package workspace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
)

// Skip records an entry that was left out of a copy, archive or collection.
type Skip struct {
	// Path is slash-separated and relative to the walked root.
	Path string `json:"path"`
	// Reason says why the entry was left out.
	Reason string `json:"reason"`
}

// Bounds on the trees the walkers descend into and the archive names
// UnpackHome accepts, so that a hostile tree cannot exhaust file descriptors,
// memory or time. The walkers keep one directory open per level.
const (
	// MaxDepth is the deepest path, in components, that is walked or
	// restored: a directory MaxDepth levels down is kept, its contents are
	// skipped with a reason.
	MaxDepth = 256
	// MaxPathBytes is the longest path (relative to the walked root, without
	// a trailing slash) that is walked or restored; longer entries are
	// skipped with a reason.
	MaxPathBytes = 4096
	// MaxSkips is how many skipped entries a report lists; further skips are
	// only counted (see DroppedSkips in PackStats, CopyStats and
	// CollectReport), so a tree of millions of FIFOs cannot fill memory.
	MaxSkips = 1000
)

// Skip reasons shared by the walkers.
const (
	reasonReplaced   = "replaced during walk"
	reasonOtherFS    = "directory on another filesystem (mount point); not crossed"
	reasonNotRegular = "not a regular file after open"
)

var (
	reasonTooDeep = fmt.Sprintf("contents not walked: deeper than %d levels (MaxDepth)", MaxDepth)
	reasonTooLong = fmt.Sprintf("path longer than %d bytes (MaxPathBytes)", MaxPathBytes)
)

// skipList keeps the first MaxSkips skips and counts the rest.
type skipList struct {
	list    []Skip
	dropped int64
}

func (s *skipList) add(rel, reason string) {
	if len(s.list) >= MaxSkips {
		s.dropped++
		return
	}
	s.list = append(s.list, Skip{Path: rel, Reason: reason})
}

// kept returns a copy of the listed skips, nil when there are none.
func (s *skipList) kept() []Skip {
	return slices.Clone(s.list)
}

// dirRef is an open directory shared by the walker and the workers that copy
// files out of it; the last release closes it.
type dirRef struct {
	root *os.Root
	refs atomic.Int32
}

func newDirRef(root *os.Root) *dirRef {
	d := &dirRef{root: root}
	d.refs.Store(1)
	return d
}

func (d *dirRef) acquire() { d.refs.Add(1) }

func (d *dirRef) release() {
	if d.refs.Add(-1) == 0 {
		d.root.Close()
	}
}

// node is one entry found by the walker, named by a single path component
// inside its parent directory.
type node struct {
	rel    string      // slash path relative to the walked root
	name   string      // last component of rel
	parent *dirRef     // open parent directory
	info   fs.FileInfo // Lstat result
}

// visitor receives the entries of a walk. Entries that are neither regular
// files, directories nor symlinks are reported to skip and never opened.
type visitor interface {
	// exclude reports whether rel is left out silently (by configuration).
	exclude(rel string) bool
	// enterDir is called before the children of a directory are walked and
	// returns the function to call after them; a nil function means the
	// children are not walked.
	enterDir(n node, dir *dirRef) (leave func() error, err error)
	file(n node) error
	symlink(n node, target string) error
	skip(rel, reason string)
}

// walker traverses a tree one directory at a time through os.Root.
type walker struct {
	dev uint64
	v   visitor
}

// openTop opens dir as a Root after checking that dir itself is a real
// directory and not a symlink to one.
func openTop(dir string) (*os.Root, fs.FileInfo, error) {
	info, err := os.Lstat(dir)
	if err != nil {
		return nil, nil, err
	}
	if !info.IsDir() {
		return nil, nil, fmt.Errorf("%s is a %s, not a directory", dir, describeType(info.Mode()))
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, nil, err
	}
	got, err := root.Stat(".")
	if err != nil || !os.SameFile(info, got) {
		root.Close()
		return nil, nil, fmt.Errorf("%s was replaced while being opened", dir)
	}
	return root, info, nil
}

// walkTree walks every entry below top (not top itself) depth-first in name
// order. topInfo is top's Lstat result from openTop. It does not close top.
// The contents of directories MaxDepth levels down and entries whose path is
// longer than MaxPathBytes are reported to the visitor's skip, never walked.
func walkTree(ctx context.Context, top *os.Root, topInfo fs.FileInfo, v visitor) error {
	w := &walker{dev: deviceOf(topInfo), v: v}
	ref := newDirRef(top)
	ref.acquire() // the caller keeps top open
	defer ref.release()
	return w.walkDir(ctx, ref, "", 0)
}

// walkDir walks the entries of dir, which is depth levels below the root.
func (w *walker) walkDir(ctx context.Context, dir *dirRef, rel string, depth int) error {
	names, err := readDirNames(dir.root)
	if err != nil {
		return fmt.Errorf("read directory %q: %w", displayRel(rel), err)
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		childRel := path.Join(rel, name)
		if w.v.exclude(childRel) {
			continue
		}
		if depth >= MaxDepth {
			w.v.skip(rel, reasonTooDeep)
			return nil
		}
		if len(childRel) > MaxPathBytes {
			w.v.skip(childRel, reasonTooLong)
			continue
		}
		if err := w.visit(ctx, dir, childRel, name, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// visit handles the entry name of dir, found at rel, depth levels down.
func (w *walker) visit(ctx context.Context, dir *dirRef, rel, name string, depth int) error {
	info, err := dir.root.Lstat(name)
	if err != nil {
		w.v.skip(rel, "cannot stat: "+errText(err))
		return nil
	}
	n := node{rel: rel, name: name, parent: dir, info: info}
	mode := info.Mode()
	switch {
	case mode.IsDir():
		return w.visitDir(ctx, n, depth)
	case mode.IsRegular():
		return w.v.file(n)
	case mode&fs.ModeSymlink != 0:
		target, err := dir.root.Readlink(name)
		if err != nil {
			w.v.skip(rel, "cannot read symlink: "+errText(err))
			return nil
		}
		return w.v.symlink(n, target)
	default:
		w.v.skip(rel, describeType(mode)+" (only regular files, directories and symlinks are kept)")
		return nil
	}
}

func (w *walker) visitDir(ctx context.Context, n node, depth int) error {
	if deviceOf(n.info) != w.dev {
		w.v.skip(n.rel, reasonOtherFS)
		return nil
	}
	child, err := n.parent.root.OpenRoot(n.name)
	if err != nil {
		w.v.skip(n.rel, "cannot open directory: "+errText(err))
		return nil
	}
	got, err := child.Stat(".")
	if err != nil || !os.SameFile(n.info, got) {
		child.Close()
		w.v.skip(n.rel, reasonReplaced)
		return nil
	}
	ref := newDirRef(child)
	defer ref.release()
	leave, err := w.v.enterDir(n, ref)
	if err != nil || leave == nil {
		return err
	}
	walkErr := w.walkDir(ctx, ref, n.rel, depth)
	return errors.Join(walkErr, leave())
}

func readDirNames(root *os.Root) ([]string, error) {
	f, err := root.Open(".")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

// openRegular opens the regular file n without following a symlink and
// without blocking, and checks that what was opened is still the entry the
// walker saw. A non-empty reason means the file must be skipped.
func openRegular(n node) (f *os.File, info fs.FileInfo, reason string) {
	f, err := n.parent.root.OpenFile(n.name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, "cannot open: " + errText(err)
	}
	info, err = f.Stat()
	switch {
	case err != nil:
		reason = "cannot stat after open: " + errText(err)
	case !info.Mode().IsRegular():
		reason = reasonNotRegular + " (" + describeType(info.Mode()) + ")"
	case !os.SameFile(n.info, info):
		reason = reasonReplaced
	}
	if reason != "" {
		f.Close()
		return nil, nil, reason
	}
	return f, info, ""
}

// symlinkReason returns why the symlink at rel (relative to top) pointing at
// target must not be kept, or "" if it is relative and stays inside top.
// It checks the target lexically and then resolves it through top (which
// refuses to leave it), so a chain of in-tree links cannot escape either.
// Dangling links that stay inside are kept.
func symlinkReason(top *os.Root, rel, target string) string {
	switch {
	case target == "":
		return "symlink with an empty target"
	case path.IsAbs(target):
		return fmt.Sprintf("symlink to absolute path %q (only relative links inside the tree are kept)", target)
	case !filepath.IsLocal(path.Join(path.Dir(rel), target)):
		return fmt.Sprintf("symlink target %q leaves the tree", target)
	}
	_, err := top.Stat(rel)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Sprintf("symlink target %q does not resolve inside the tree: %s", target, errText(err))
	}
	return ""
}

func describeType(mode fs.FileMode) string {
	switch {
	case mode&fs.ModeNamedPipe != 0:
		return "named pipe (FIFO)"
	case mode&fs.ModeCharDevice != 0:
		return "character device"
	case mode&fs.ModeDevice != 0:
		return "block device"
	case mode&fs.ModeSocket != 0:
		return "socket"
	case mode&fs.ModeSymlink != 0:
		return "symlink"
	case mode.IsDir():
		return "directory"
	case mode.IsRegular():
		return "regular file"
	default:
		return "irregular file"
	}
}

func deviceOf(info fs.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev) //nolint:unconvert // Dev is uint32 on some platforms
	}
	return 0
}

// errText strips the path prefix from filesystem errors so skip reasons do not
// repeat (or leak) host paths.
func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

func displayRel(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}
