package workspace

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/klauspost/compress/gzip"
)

// PackOptions controls PackHome.
type PackOptions struct {
	// Exclude lists glob patterns relative to home (see DefaultExcludes for
	// the syntax and the usual set). Matching entries are left out silently
	// and counted in PackStats.Excluded.
	Exclude []string
	// MaxBytes caps the total size of file contents in the archive; files
	// that would exceed it are skipped with a reason. Zero means
	// DefaultUnpackLimits.MaxBytes, so that every archive PackHome writes can
	// be restored with the default limits.
	MaxBytes int64
	// MaxEntries caps the number of entries; zero means DefaultUnpackLimits.MaxEntries.
	MaxEntries int64
	// Ledger, when set, is shared with the run's Collect calls (see
	// CollectOptions.Ledger). Nil means a ledger of this call alone.
	Ledger *Ledger
}

// PackStats summarises a PackHome call.
type PackStats struct {
	// Files, Dirs and Symlinks count the entries archived.
	Files    int64 `json:"files"`
	Dirs     int64 `json:"dirs"`
	Symlinks int64 `json:"symlinks"`
	// Bytes is the total size of the file contents archived.
	Bytes int64 `json:"bytes"`
	// CompressedBytes is the number of bytes written to w.
	CompressedBytes int64 `json:"compressed_bytes"`
	// Excluded counts entries (whole subtrees for directories) matched by
	// PackOptions.Exclude.
	Excluded int64 `json:"excluded"`
	// Skipped lists the entries left out for safety or caps, with the reason: the
	// first MaxSkips of them.
	Skipped []Skip `json:"skipped,omitempty"`
	// DroppedSkips counts the skipped entries not listed in Skipped because
	// it already held MaxSkips; len(Skipped)+DroppedSkips entries were skipped.
	DroppedSkips int64 `json:"dropped_skips,omitempty"`
}

// PackHome streams home as a gzip-compressed tar archive into w, with paths
// relative to home, without staging a copy on disk.
//
// It keeps regular files, directories and symlinks with their permission bits
// and modification times (to the second). Symlinks are recorded as symlinks,
// never followed, and only when they are relative and resolve inside home
// (UnpackHome would reject the archive otherwise). FIFOs, sockets, devices,
// entries over the size or count caps, sparse files and second links to a
// hard-linked file (see CollectOptions and Ledger), the contents of directories MaxDepth
// levels down and paths longer than MaxPathBytes are skipped and recorded in
// PackStats.Skipped (the first MaxSkips; the rest are counted in
// PackStats.DroppedSkips). home is read through os.Root with O_NOFOLLOW|O_NONBLOCK
// opens, so nothing outside it is read and no special file can block it.
// Call it only after the container has stopped.
func PackHome(ctx context.Context, home string, w io.Writer, opts PackOptions) (PackStats, error) {
	ex, err := newExcluder(opts.Exclude)
	if err != nil {
		return PackStats{}, fmt.Errorf("pack home: %w", err)
	}
	top, info, err := openTop(home)
	if err != nil {
		return PackStats{}, fmt.Errorf("pack home: %w", err)
	}
	defer top.Close()

	cw := &countingWriter{w: w}
	gz := gzip.NewWriter(cw)
	p := &packer{tw: tar.NewWriter(gz), top: top, ex: ex, limits: opts.withDefaults()}
	err = walkTree(ctx, top, info, p)
	if err == nil {
		err = p.tw.Close()
	}
	if err == nil {
		err = gz.Close()
	}
	p.stats.CompressedBytes = cw.n
	p.stats.Skipped = p.skips.kept()
	p.stats.DroppedSkips = p.skips.dropped
	if err != nil {
		return p.stats, fmt.Errorf("pack home %s: %w", home, err)
	}
	return p.stats, nil
}

func (o PackOptions) withDefaults() PackOptions {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultUnpackLimits.MaxBytes
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultUnpackLimits.MaxEntries
	}
	if o.Ledger == nil {
		o.Ledger = NewLedger(o.MaxBytes)
	}
	return o
}

type packer struct {
	tw      *tar.Writer
	top     *os.Root
	ex      *excluder
	limits  PackOptions
	entries int64
	skips   skipList
	stats   PackStats
}

func (p *packer) exclude(rel string) bool {
	if p.ex.match(rel) {
		p.stats.Excluded++
		return true
	}
	return false
}

func (p *packer) skip(rel, reason string) {
	p.skips.add(rel, reason)
}

// admit counts one more entry, or records a skip when the cap is reached.
func (p *packer) admit(rel string) bool {
	if p.entries >= p.limits.MaxEntries {
		p.skip(rel, fmt.Sprintf("archive entry cap of %d reached", p.limits.MaxEntries))
		return false
	}
	p.entries++
	return true
}

func (p *packer) header(n node, typ byte) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     n.rel,
		Mode:     int64(n.info.Mode().Perm()),
		ModTime:  n.info.ModTime().Truncate(time.Second),
	}
}

func (p *packer) enterDir(n node, _ *dirRef) (func() error, error) {
	if !p.admit(n.rel) {
		return nil, nil
	}
	hdr := p.header(n, tar.TypeDir)
	hdr.Name += "/"
	if err := p.tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	p.stats.Dirs++
	return func() error { return nil }, nil
}

func (p *packer) file(n node) error {
	f, info, reason := openRegular(n)
	if reason != "" {
		p.skip(n.rel, reason)
		return nil
	}
	defer f.Close()
	size := info.Size()
	if size > p.limits.MaxBytes-p.stats.Bytes {
		p.skip(n.rel, fmt.Sprintf("file of %d bytes would exceed the archive cap of %d bytes", size, p.limits.MaxBytes))
		return nil
	}
	if !p.admit(n.rel) {
		return nil
	}
	if reason := p.limits.Ledger.admit(n.rel, info); reason != "" {
		p.entries--
		p.skip(n.rel, reason)
		return nil
	}
	hdr := p.header(n, tar.TypeReg)
	hdr.Size = size
	if err := p.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.CopyN(p.tw, f, size); err != nil {
		return fmt.Errorf("archive %q: %w", n.rel, err)
	}
	p.stats.Files++
	p.stats.Bytes += size
	return nil
}

func (p *packer) symlink(n node, target string) error {
	if reason := symlinkReason(p.top, n.rel, target); reason != "" {
		p.skip(n.rel, reason)
		return nil
	}
	if !p.admit(n.rel) {
		return nil
	}
	hdr := p.header(n, tar.TypeSymlink)
	hdr.Mode = 0o777
	hdr.Linkname = target
	if err := p.tw.WriteHeader(hdr); err != nil {
		return err
	}
	p.stats.Symlinks++
	return nil
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
