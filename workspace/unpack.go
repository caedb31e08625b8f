package workspace

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
)

// UnpackLimits bounds what UnpackHome accepts. A zero field means the
// corresponding DefaultUnpackLimits value, never "unlimited".
type UnpackLimits struct {
	// MaxBytes caps the total size of file contents.
	MaxBytes int64
	// MaxEntries caps the number of archive entries.
	MaxEntries int64
	// MaxRatio caps expanded file bytes per compressed byte read, enforced
	// continuously once RatioGrace bytes have been expanded.
	MaxRatio int64
	// RatioGrace is how many expanded bytes are allowed before MaxRatio applies,
	// so that small, very compressible archives are not rejected.
	RatioGrace int64
}

// DefaultUnpackLimits are generous for a developer home directory yet stop an
// archive bomb after a few megabytes: gzip reaches about 1000:1 on zeros,
// while source trees and dependency caches compress 3:1 to 20:1.
var DefaultUnpackLimits = UnpackLimits{
	MaxBytes:   4 << 30,
	MaxEntries: 200_000,
	MaxRatio:   200,
	RatioGrace: 16 << 20,
}

func (l UnpackLimits) withDefaults() UnpackLimits {
	d := DefaultUnpackLimits
	if l.MaxBytes <= 0 {
		l.MaxBytes = d.MaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = d.MaxEntries
	}
	if l.MaxRatio <= 0 {
		l.MaxRatio = d.MaxRatio
	}
	if l.RatioGrace <= 0 {
		l.RatioGrace = d.RatioGrace
	}
	return l
}

// UnpackOptions controls UnpackHome.
type UnpackOptions struct {
	// Limits bounds the archive; zero fields take DefaultUnpackLimits values.
	Limits UnpackLimits
	// Owner, when set and the process runs as root, owns every extracted
	// entry (normally SandboxOwner).
	Owner *Owner
}

// UnpackStats summarises a successful UnpackHome call.
type UnpackStats struct {
	// Files, Dirs and Symlinks count the entries created (Dirs includes
	// parents the archive did not list).
	Files    int64 `json:"files"`
	Dirs     int64 `json:"dirs"`
	Symlinks int64 `json:"symlinks"`
	// Bytes is the total size of the file contents extracted.
	Bytes int64 `json:"bytes"`
	// CompressedBytes is the number of bytes read from the archive stream.
	CompressedBytes int64 `json:"compressed_bytes"`
}

// ErrLimitExceeded is wrapped by UnpackHome errors caused by an archive
// that exceeds UnpackLimits.
var ErrLimitExceeded = errors.New("archive exceeds unpack limits")

// UnsafeEntryError reports an archive entry UnpackHome refuses to extract.
type UnsafeEntryError struct {
	// Name is the entry's name as stored in the archive.
	Name string
	// Reason says what is unsafe about it.
	Reason string
}

// Error names the entry and the reason it was refused.
func (e *UnsafeEntryError) Error() string {
	return fmt.Sprintf("unsafe archive entry %q: %s", e.Name, e.Reason)
}

func unsafeEntry(name, format string, args ...any) error {
	return &UnsafeEntryError{Name: name, Reason: fmt.Sprintf(format, args...)}
}

// trailerLimit bounds the data read after the end of the tar stream, which is
// drained so that the gzip checksum is verified.
const trailerLimit = 1 << 20

// UnpackHome extracts a gzip-compressed tar archive written by PackHome into
// dest, which must be missing or an empty directory.
//
// Extraction goes into a staging directory next to dest, through os.Root, and
// the staging directory is renamed onto dest only when every entry has been
// accepted; on any error it is removed and dest is left as it was (empty).
// An entry is refused with an *UnsafeEntryError when its name is absolute or
// has a ".." component, when it passes through a symlink created by an
// earlier entry, when it repeats an earlier entry, when it is a hard link,
// device node or FIFO (or any other type but file, directory and symlink), or
// when it is a symlink whose target is absolute or resolves outside dest.
// Exceeding a limit fails with an error wrapping ErrLimitExceeded; the ratio
// limit is checked while decompressing, so a bomb is stopped early. Entry
// names longer than MaxPathBytes or deeper than MaxDepth components exceed a
// limit too (PackHome never writes them).
//
// Files and directories get their archived permission bits (set-id and sticky
// bits dropped) and modification times, and belong to opts.Owner when set and
// running as root.
func UnpackHome(ctx context.Context, r io.Reader, dest string, opts UnpackOptions) (UnpackStats, error) {
	destInfo, err := checkUnpackDest(dest)
	if err != nil {
		return UnpackStats{}, fmt.Errorf("unpack home: %w", err)
	}
	staging, err := os.MkdirTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".unpack-")
	if err != nil {
		return UnpackStats{}, fmt.Errorf("unpack home: staging directory: %w", err)
	}
	stats, err := extractArchive(ctx, r, staging, opts.Limits.withDefaults(), opts.Owner)
	if err == nil {
		err = moveIntoPlace(staging, dest, destInfo, opts.Owner)
	}
	if err != nil {
		if rmErr := os.RemoveAll(staging); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("remove staging directory: %w", rmErr))
		}
		return UnpackStats{}, fmt.Errorf("unpack home into %s (nothing was restored): %w", dest, err)
	}
	return stats, nil
}

// checkUnpackDest returns dest's Lstat result, or nil when it does not exist.
func checkUnpackDest(dest string) (fs.FileInfo, error) {
	info, err := os.Lstat(dest)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	empty, err := isEmptyDir(dest)
	if err != nil {
		return nil, err
	}
	if !empty {
		return nil, fmt.Errorf("%s is not empty; restore session state into a fresh home before copying other files in", dest)
	}
	return info, nil
}

// moveIntoPlace gives staging dest's mode and owner (or 0755 and owner when
// dest is missing) and renames it onto dest.
func moveIntoPlace(staging, dest string, destInfo fs.FileInfo, owner *Owner) error {
	perm := fs.FileMode(0o755)
	chownTo := owner
	if destInfo != nil {
		perm = destInfo.Mode().Perm()
		if st, ok := destInfo.Sys().(*syscall.Stat_t); ok {
			chownTo = &Owner{UID: int(st.Uid), GID: int(st.Gid)}
		}
	}
	if chownTo.chownable() {
		if err := os.Lchown(staging, chownTo.UID, chownTo.GID); err != nil {
			return err
		}
	}
	if err := os.Chmod(staging, perm); err != nil {
		return err
	}
	// os.Rename refuses to replace a directory; rename(2) atomically replaces
	// an empty one, and fails with ENOTEMPTY if dest gained content meanwhile.
	if err := syscall.Rename(staging, dest); err != nil {
		return &os.LinkError{Op: "rename", Old: staging, New: dest, Err: err}
	}
	return nil
}

func extractArchive(ctx context.Context, r io.Reader, dir string, lim UnpackLimits, owner *Owner) (UnpackStats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return UnpackStats{}, err
	}
	defer root.Close()
	cr := &countingReader{r: r}
	gz, err := gzip.NewReader(cr)
	if err != nil {
		return UnpackStats{}, fmt.Errorf("read archive: not a gzip stream: %w", err)
	}
	x := &extractor{
		ctx:    ctx,
		root:   root,
		owner:  owner,
		budget: budget{lim: lim, compressed: cr},
		links:  map[string]string{},
		dirs:   map[string]dirFix{},
		made:   map[string]bool{},
	}
	if err := x.run(tar.NewReader(gz)); err != nil {
		return UnpackStats{}, err
	}
	if err := drainTrailer(gz); err != nil {
		return UnpackStats{}, err
	}
	x.stats.Bytes = x.budget.expanded
	x.stats.CompressedBytes = cr.n
	return x.stats, nil
}

func drainTrailer(gz io.Reader) error {
	n, err := io.Copy(io.Discard, io.LimitReader(gz, trailerLimit+1))
	if err != nil {
		return fmt.Errorf("read archive: %w", err)
	}
	if n > trailerLimit {
		return fmt.Errorf("%w: more than %d bytes of data after the end of the archive", ErrLimitExceeded, trailerLimit)
	}
	return nil
}

// extractor writes accepted entries under root and remembers what it made.
type extractor struct {
	ctx    context.Context
	root   *os.Root
	owner  *Owner
	budget budget
	links  map[string]string // symlink path -> target
	dirs   map[string]dirFix // explicit directory entries
	made   map[string]bool   // directories known to exist
	stats  UnpackStats
}

func (x *extractor) run(tr *tar.Reader) error {
	for {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
	if err := x.checkLinks(); err != nil {
		return err
	}
	return x.fixDirs()
}

func (x *extractor) entry(hdr *tar.Header, tr io.Reader) error {
	if err := x.budget.entry(); err != nil {
		return err
	}
	if err := checkNameSize(hdr.Name); err != nil {
		return err
	}
	name, err := entryName(hdr.Name)
	if err != nil || name == "." {
		return err
	}
	if err := x.checkPath(hdr.Name, name); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(hdr, name)
	case tar.TypeReg:
		return x.file(hdr, name, tr)
	case tar.TypeSymlink:
		return x.symlink(hdr, name)
	case tar.TypeLink:
		return unsafeEntry(hdr.Name, "hard link entries are not allowed (target %q)", hdr.Linkname)
	case tar.TypeChar, tar.TypeBlock:
		return unsafeEntry(hdr.Name, "device node entries are not allowed")
	case tar.TypeFifo:
		return unsafeEntry(hdr.Name, "FIFO entries are not allowed")
	default:
		return unsafeEntry(hdr.Name, "unsupported entry type %q; only files, directories and symlinks are restored", hdr.Typeflag)
	}
}

// checkNameSize refuses names longer than MaxPathBytes (ignoring a trailing
// slash) or with more than MaxDepth components, before any work proportional
// to their depth is done for them.
func checkNameSize(raw string) error {
	trimmed := strings.TrimSuffix(raw, "/")
	if len(trimmed) > MaxPathBytes {
		return fmt.Errorf("%w: entry %q... is %d bytes long, over the %d-byte path limit (MaxPathBytes)",
			ErrLimitExceeded, trimmed[:64], len(trimmed), MaxPathBytes)
	}
	if n := strings.Count(path.Clean(trimmed), "/") + 1; n > MaxDepth {
		return fmt.Errorf("%w: entry %q has %d path components, over the %d-level limit (MaxDepth)",
			ErrLimitExceeded, trimmed, n, MaxDepth)
	}
	return nil
}

// entryName validates a raw archive name and returns it cleaned.
func entryName(raw string) (string, error) {
	switch {
	case raw == "":
		return "", unsafeEntry(raw, "empty name")
	case strings.HasPrefix(raw, "/"):
		return "", unsafeEntry(raw, "absolute path")
	case slices.Contains(strings.Split(raw, "/"), ".."):
		return "", unsafeEntry(raw, `path has a ".." component`)
	}
	name := path.Clean(raw)
	if !filepath.IsLocal(name) {
		return "", unsafeEntry(raw, "not a local path")
	}
	return name, nil
}

// checkPath refuses names that repeat or pass through an earlier symlink entry.
func (x *extractor) checkPath(raw, name string) error {
	if _, ok := x.links[name]; ok {
		return unsafeEntry(raw, "duplicate of an earlier symlink entry")
	}
	for p := path.Dir(name); p != "."; p = path.Dir(p) {
		if _, ok := x.links[p]; ok {
			return unsafeEntry(raw, "path goes through the symlink %q created by an earlier entry", p)
		}
	}
	return nil
}

func (x *extractor) dir(hdr *tar.Header, name string) error {
	if err := x.mkdirAll(hdr.Name, name); err != nil {
		return err
	}
	atime, mtime := headerTimes(hdr)
	x.dirs[name] = dirFix{rel: name, perm: modeOf(hdr), atime: atime, mtime: mtime}
	return nil
}

// mkdirAll creates name and its missing parents, refusing non-directories in
// the way. New directories get 0700 until fixDirs applies the final modes.
func (x *extractor) mkdirAll(raw, name string) error {
	if name == "." || x.made[name] {
		return nil
	}
	if err := x.mkdirAll(raw, path.Dir(name)); err != nil {
		return err
	}
	err := x.root.Mkdir(name, 0o700)
	switch {
	case errors.Is(err, fs.ErrExist):
		info, lerr := x.root.Lstat(name)
		if lerr != nil {
			return lerr
		}
		if !info.IsDir() {
			return unsafeEntry(raw, "%q already exists as a %s", name, describeType(info.Mode()))
		}
	case err != nil:
		return err
	default:
		x.stats.Dirs++
		if err := x.chown(name); err != nil {
			return err
		}
	}
	x.made[name] = true
	return nil
}

func (x *extractor) file(hdr *tar.Header, name string, tr io.Reader) error {
	if err := x.budget.reserve(hdr.Name, hdr.Size); err != nil {
		return err
	}
	if err := x.mkdirAll(hdr.Name, path.Dir(name)); err != nil {
		return err
	}
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return unsafeEntry(hdr.Name, "duplicate of an earlier entry")
	}
	if err != nil {
		return err
	}
	err = x.writeFile(f, hdr, tr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	atime, mtime := headerTimes(hdr)
	x.stats.Files++
	return x.root.Chtimes(name, atime, mtime)
}

func (x *extractor) writeFile(f *os.File, hdr *tar.Header, tr io.Reader) error {
	if _, err := io.Copy(&budgetWriter{ctx: x.ctx, w: f, b: &x.budget}, tr); err != nil {
		return fmt.Errorf("extract %q: %w", hdr.Name, err)
	}
	if x.owner.chownable() {
		if err := f.Chown(x.owner.UID, x.owner.GID); err != nil {
			return err
		}
	}
	return f.Chmod(modeOf(hdr))
}

func (x *extractor) symlink(hdr *tar.Header, name string) error {
	target := hdr.Linkname
	switch {
	case target == "":
		return unsafeEntry(hdr.Name, "symlink with an empty target")
	case path.IsAbs(target):
		return unsafeEntry(hdr.Name, "symlink to absolute path %q", target)
	case !filepath.IsLocal(path.Join(path.Dir(name), target)):
		return unsafeEntry(hdr.Name, "symlink target %q leaves the destination", target)
	}
	if err := x.mkdirAll(hdr.Name, path.Dir(name)); err != nil {
		return err
	}
	err := x.root.Symlink(target, name)
	if errors.Is(err, fs.ErrExist) {
		return unsafeEntry(hdr.Name, "duplicate of an earlier entry")
	}
	if err != nil {
		return err
	}
	x.links[name] = target
	x.stats.Symlinks++
	return x.chown(name)
}

// checkLinks resolves every extracted symlink through the root once all
// entries exist, so that chains of in-tree links cannot point outside.
func (x *extractor) checkLinks() error {
	for _, name := range slices.Sorted(maps.Keys(x.links)) {
		if reason := symlinkReason(x.root, name, x.links[name]); reason != "" {
			return unsafeEntry(name, "%s", reason)
		}
	}
	return nil
}

// fixDirs applies the archived directory modes and times, deepest first.
func (x *extractor) fixDirs() error {
	names := slices.SortedFunc(maps.Keys(x.dirs), func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
	for _, name := range names {
		fix := x.dirs[name]
		if err := x.root.Chmod(name, fix.perm); err != nil {
			return err
		}
		if err := x.root.Chtimes(name, fix.atime, fix.mtime); err != nil {
			return err
		}
	}
	return nil
}

func (x *extractor) chown(name string) error {
	if !x.owner.chownable() {
		return nil
	}
	return x.root.Lchown(name, x.owner.UID, x.owner.GID)
}

func headerTimes(hdr *tar.Header) (atime, mtime time.Time) {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime, hdr.ModTime
	}
	return hdr.AccessTime, hdr.ModTime
}

// budget enforces UnpackLimits while an archive is read.
type budget struct {
	lim        UnpackLimits
	compressed *countingReader
	expanded   int64
	entries    int64
}

func (b *budget) entry() error {
	b.entries++
	if b.entries > b.lim.MaxEntries {
		return fmt.Errorf("%w: more than %d entries", ErrLimitExceeded, b.lim.MaxEntries)
	}
	return nil
}

// reserve refuses an entry whose declared size cannot fit, before reading it.
func (b *budget) reserve(name string, size int64) error {
	if size > b.lim.MaxBytes-b.expanded {
		return fmt.Errorf("%w: entry %q declares %d bytes, over the %d-byte total", ErrLimitExceeded, name, size, b.lim.MaxBytes)
	}
	return nil
}

// add accounts n more expanded bytes, before they are written.
func (b *budget) add(n int) error {
	b.expanded += int64(n)
	if b.expanded > b.lim.MaxBytes {
		return fmt.Errorf("%w: more than %d bytes of file content", ErrLimitExceeded, b.lim.MaxBytes)
	}
	if b.expanded > b.lim.RatioGrace && b.expanded > b.lim.MaxRatio*b.compressed.n {
		return fmt.Errorf("%w: expanded %d bytes from %d compressed bytes, over the %d:1 ratio cap",
			ErrLimitExceeded, b.expanded, b.compressed.n, b.lim.MaxRatio)
	}
	return nil
}

// budgetWriter charges every write to a budget before making it.
type budgetWriter struct {
	ctx context.Context
	w   io.Writer
	b   *budget
}

func (bw *budgetWriter) Write(p []byte) (int, error) {
	if err := bw.ctx.Err(); err != nil {
		return 0, err
	}
	if err := bw.b.add(len(p)); err != nil {
		return 0, err
	}
	return bw.w.Write(p)
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// modeOf converts a tar header mode to permission bits, dropping set-id and
// sticky bits.
func modeOf(hdr *tar.Header) fs.FileMode {
	return fs.FileMode(hdr.Mode) & fs.ModePerm
}
