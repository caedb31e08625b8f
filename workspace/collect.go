package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// Default caps for Collect, used for zero CollectOptions fields.
const (
	DefaultCollectMaxFileBytes  int64 = 512 << 20
	DefaultCollectMaxTotalBytes int64 = 2 << 30
	DefaultCollectMaxFiles      int64 = 10_000
)

// ErrFileChanged is returned by a CollectedFile's Reader when the file grew
// after Collect measured it (the container should have been stopped).
var ErrFileChanged = errors.New("file changed while being collected")

// CollectOptions bounds what Collect hands to its visit function. Zero fields
// take the DefaultCollect* values, never "unlimited". Files over a cap are
// skipped with a reason, never truncated.
type CollectOptions struct {
	// MaxFileBytes caps the size of one file.
	MaxFileBytes int64
	// MaxTotalBytes caps the total size of all collected files.
	MaxTotalBytes int64
	// MaxFiles caps the number of collected files.
	MaxFiles int64
	// Ledger, when set, is shared with the run's other Collect and PackHome
	// calls: it caps their total and reads a hard-linked file once across
	// them. Nil means a ledger of this call alone, capped at MaxTotalBytes.
	Ledger *Ledger
}

func (o CollectOptions) withDefaults() CollectOptions {
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultCollectMaxFileBytes
	}
	if o.MaxTotalBytes <= 0 {
		o.MaxTotalBytes = DefaultCollectMaxTotalBytes
	}
	if o.MaxFiles <= 0 {
		o.MaxFiles = DefaultCollectMaxFiles
	}
	if o.Ledger == nil {
		o.Ledger = NewLedger(o.MaxTotalBytes)
	}
	return o
}

// CollectedFile is one regular file handed to Collect's visit function.
type CollectedFile struct {
	// RelPath is slash-separated and relative to the collected root.
	RelPath string
	// Size is the file's size when it was opened.
	Size int64
	// Mode is the file's mode (always a regular file).
	Mode fs.FileMode
	// Reader yields exactly Size bytes. It is valid only during the visit call.
	Reader io.Reader
}

// CollectReport summarises a Collect call.
type CollectReport struct {
	// Files and Bytes count what was handed to visit.
	Files int64 `json:"files"`
	Bytes int64 `json:"bytes"`
	// Skipped lists the entries not handed to visit, with the reason: the
	// first MaxSkips of them.
	Skipped []Skip `json:"skipped,omitempty"`
	// DroppedSkips counts the skipped entries not listed in Skipped because
	// it already held MaxSkips; len(Skipped)+DroppedSkips entries were skipped.
	DroppedSkips int64 `json:"dropped_skips,omitempty"`
}

// Collect hands every regular file under root to visit, in path order, after
// the container that wrote them has stopped.
//
// root is walked through os.Root one directory at a time; each file is
// Lstat-ed, opened with O_NOFOLLOW|O_NONBLOCK and fstat-ed again, and used only
// if it is still the same regular file. Symlinks (wherever they point), FIFOs,
// sockets, devices, mount points, entries replaced during the walk, files
// over the caps, sparse files (a size over the allocated blocks plus
// SparseAllowance), a second link to a hard-linked file already read through
// the Ledger, files past the Ledger's total, the contents of directories MaxDepth levels down and paths
// longer than MaxPathBytes are skipped and listed in CollectReport.Skipped
// with the reason (the first MaxSkips; the rest are counted in
// CollectReport.DroppedSkips). Nothing outside root is ever opened, and no
// special file can make Collect block.
//
// An error from visit stops the walk and is returned, except one wrapping
// ErrFileChanged (the Reader's report that the file changed size while being
// read): that file is recorded as skipped and the walk goes on, so visit must
// discard whatever it stored from a Reader that failed.
func Collect(ctx context.Context, root string, opts CollectOptions, visit func(ctx context.Context, f CollectedFile) error) (CollectReport, error) {
	top, info, err := openTop(root)
	if err != nil {
		return CollectReport{}, fmt.Errorf("collect %s: %w", root, err)
	}
	defer top.Close()
	c := &collector{ctx: ctx, opts: opts.withDefaults(), visit: visit}
	err = walkTree(ctx, top, info, c)
	c.report.Skipped = c.skips.kept()
	c.report.DroppedSkips = c.skips.dropped
	if err != nil {
		return c.report, fmt.Errorf("collect %s: %w", root, err)
	}
	return c.report, nil
}

type collector struct {
	ctx    context.Context
	opts   CollectOptions
	visit  func(ctx context.Context, f CollectedFile) error
	skips  skipList
	report CollectReport
}

func (c *collector) exclude(string) bool { return false }

func (c *collector) skip(rel, reason string) {
	c.skips.add(rel, reason)
}

func (c *collector) enterDir(node, *dirRef) (func() error, error) {
	return func() error { return nil }, nil
}

func (c *collector) symlink(n node, target string) error {
	c.skip(n.rel, fmt.Sprintf("symlink to %q (symlinks are not followed)", target))
	return nil
}

func (c *collector) file(n node) error {
	f, info, reason := openRegular(n)
	if reason != "" {
		c.skip(n.rel, reason)
		return nil
	}
	defer f.Close()
	size := info.Size()
	if reason := c.overCap(size); reason != "" {
		c.skip(n.rel, reason)
		return nil
	}
	if reason := c.opts.Ledger.admit(n.rel, info); reason != "" {
		c.skip(n.rel, reason)
		return nil
	}
	cf := CollectedFile{RelPath: n.rel, Size: size, Mode: info.Mode(), Reader: &exactReader{r: f, left: size}}
	if err := c.visit(c.ctx, cf); err != nil {
		if errors.Is(err, ErrFileChanged) {
			c.skip(n.rel, errText(err))
			return nil
		}
		return fmt.Errorf("visit %q: %w", n.rel, err)
	}
	c.report.Files++
	c.report.Bytes += size
	return nil
}

// overCap returns why a file of size bytes cannot be collected, or "".
func (c *collector) overCap(size int64) string {
	switch {
	case size > c.opts.MaxFileBytes:
		return fmt.Sprintf("file of %d bytes is over the %d-byte per-file cap", size, c.opts.MaxFileBytes)
	case size > c.opts.MaxTotalBytes-c.report.Bytes:
		return fmt.Sprintf("file of %d bytes would exceed the %d-byte total cap", size, c.opts.MaxTotalBytes)
	case c.report.Files >= c.opts.MaxFiles:
		return fmt.Sprintf("file count cap of %d reached", c.opts.MaxFiles)
	}
	return ""
}

// exactReader yields the first left bytes of r and fails with ErrFileChanged
// if r has more, so a file that grew is reported instead of truncated.
type exactReader struct {
	r    io.Reader
	left int64
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left <= 0 {
		return e.checkEnd()
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if errors.Is(err, io.EOF) && e.left > 0 {
		return n, fmt.Errorf("%w: %d bytes shorter than when opened", ErrFileChanged, e.left)
	}
	return n, err
}

func (e *exactReader) checkEnd() (int, error) {
	var one [1]byte
	n, err := e.r.Read(one[:])
	if n > 0 {
		return 0, fmt.Errorf("%w: larger than when opened", ErrFileChanged)
	}
	if err == nil || errors.Is(err, io.EOF) {
		return 0, io.EOF
	}
	return 0, err
}
