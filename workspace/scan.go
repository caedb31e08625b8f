package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// DefaultScanMaxEntries is the ScanOptions.MaxEntries used when it is zero.
const DefaultScanMaxEntries int64 = 200_000

// ScanOptions controls Scan.
type ScanOptions struct {
	// Exclude, when set, leaves out rel (a slash path relative to the
	// scanned root) and, for a directory, everything below it.
	Exclude func(rel string) bool
	// MaxEntries caps the files and symlinks handed to visit; zero means
	// DefaultScanMaxEntries. Entries past the cap are skipped with a reason
	// and counted in ScanReport.OverCap.
	MaxEntries int64
}

// ScanEntry is one regular file or symlink found by Scan.
type ScanEntry struct {
	// RelPath is slash-separated and relative to the scanned root.
	RelPath string
	// Mode is the entry's mode: a regular file's type and permission bits,
	// or fs.ModeSymlink.
	Mode fs.FileMode
	// Size is a regular file's size when it was opened, or the length of a
	// symlink's target.
	Size int64
	// Allocated is the bytes the filesystem really allocated for a regular
	// file (its blocks): a Size far above it means a sparse file, mostly
	// holes, which costs its whole Size to read or hash. Zero for a symlink.
	Allocated int64
	// Target is a symlink's target, as stored; it is never followed.
	Target string
	// Reader yields a regular file's Size bytes (and fails wrapping
	// ErrFileChanged if the file changed size); nil for a symlink. It is
	// valid only during the visit call.
	Reader io.Reader
}

// ScanReport summarises a Scan call.
type ScanReport struct {
	// Files and Symlinks count the entries handed to visit; Bytes is the
	// total size of the files.
	Files    int64 `json:"files"`
	Symlinks int64 `json:"symlinks"`
	Bytes    int64 `json:"bytes"`
	// OverCap counts the entries left out because MaxEntries was reached.
	OverCap int64 `json:"over_cap,omitempty"`
	// Skipped lists the entries not handed to visit, with the reason: the
	// first MaxSkips of them.
	Skipped []Skip `json:"skipped,omitempty"`
	// DroppedSkips counts the skipped entries not listed in Skipped.
	DroppedSkips int64 `json:"dropped_skips,omitempty"`
}

// Scan hands every regular file and symlink under root to visit, in path
// order, with the same defences as Collect: the tree is walked through
// os.Root, symlinks are reported with their target and never followed, files
// are opened with O_NOFOLLOW|O_NONBLOCK and used only if still the same
// regular file, FIFOs, sockets, devices, mount points and over-deep or
// over-long paths are skipped with a reason. Unlike Collect it reports
// symlinks and puts no cap on file sizes, only on the number of entries; the
// caller bounds what it reads.
//
// An error from visit stops the walk and is returned, except one wrapping
// ErrFileChanged, which records the file as skipped.
func Scan(ctx context.Context, root string, opts ScanOptions, visit func(ctx context.Context, e ScanEntry) error) (ScanReport, error) {
	top, info, err := openTop(root)
	if err != nil {
		return ScanReport{}, fmt.Errorf("scan %s: %w", root, err)
	}
	defer top.Close()
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultScanMaxEntries
	}
	s := &scanner{ctx: ctx, opts: opts, visit: visit}
	err = walkTree(ctx, top, info, s)
	s.report.Skipped = s.skips.kept()
	s.report.DroppedSkips = s.skips.dropped
	if err != nil {
		return s.report, fmt.Errorf("scan %s: %w", root, err)
	}
	return s.report, nil
}

type scanner struct {
	ctx    context.Context
	opts   ScanOptions
	visit  func(ctx context.Context, e ScanEntry) error
	skips  skipList
	report ScanReport
}

func (s *scanner) exclude(rel string) bool {
	return s.opts.Exclude != nil && s.opts.Exclude(rel)
}

func (s *scanner) skip(rel, reason string) { s.skips.add(rel, reason) }

func (s *scanner) enterDir(node, *dirRef) (func() error, error) {
	return func() error { return nil }, nil
}

// admit reports whether one more entry fits under MaxEntries.
func (s *scanner) admit(rel string) bool {
	if s.report.Files+s.report.Symlinks >= s.opts.MaxEntries {
		s.report.OverCap++
		s.skip(rel, fmt.Sprintf("entry cap of %d reached", s.opts.MaxEntries))
		return false
	}
	return true
}

func (s *scanner) symlink(n node, target string) error {
	if !s.admit(n.rel) {
		return nil
	}
	e := ScanEntry{RelPath: n.rel, Mode: fs.ModeSymlink, Size: int64(len(target)), Target: target}
	if err := s.visit(s.ctx, e); err != nil {
		return fmt.Errorf("visit %q: %w", n.rel, err)
	}
	s.report.Symlinks++
	return nil
}

func (s *scanner) file(n node) error {
	if !s.admit(n.rel) {
		return nil
	}
	f, info, reason := openRegular(n)
	if reason != "" {
		s.skip(n.rel, reason)
		return nil
	}
	defer f.Close()
	size := info.Size()
	e := ScanEntry{RelPath: n.rel, Mode: info.Mode(), Size: size, Allocated: allocated(info), Reader: &exactReader{r: f, left: size}}
	if err := s.visit(s.ctx, e); err != nil {
		if errors.Is(err, ErrFileChanged) {
			s.skip(n.rel, errText(err))
			return nil
		}
		return fmt.Errorf("visit %q: %w", n.rel, err)
	}
	s.report.Files++
	s.report.Bytes += size
	return nil
}
