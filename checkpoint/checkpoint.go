// Package checkpoint packs the directory a sandbox backend checkpointed a
// live run into as one compressed archive, stored like any other object of
// the run, and unpacks it again on the host that resumes the run.
//
// An archive is a zstd-compressed tar whose first entry is the manifest,
// checkpoint.json (which run, tenant, runtime and image it belongs to), and
// whose other entries are the checkpoint's regular files and directories.
// Pack returns the manifest with the archive's sha256 digest and size; the
// caller keeps that manifest in the run's record. Unpack checks, before
// anything is written, that the archive has that digest and that its own
// manifest names the run and tenant expected, and then extracts through an
// os.Root, refusing any entry that is not a plain file or directory inside
// the destination.
package checkpoint

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/taskrun/taskrun/sandbox"
)

// ManifestName is the archive's first entry.
const ManifestName = "checkpoint.json"

// FormatVersion is the archive format Pack writes and Unpack reads.
const FormatVersion = 1

// Errors Unpack wraps, for errors.Is.
var (
	// ErrDigest means the archive is not the one the manifest names: it
	// was changed or replaced after Pack.
	ErrDigest = errors.New("checkpoint digest mismatch")
	// ErrForeign means the archive belongs to another run or tenant.
	ErrForeign = errors.New("checkpoint belongs to another run")
	// ErrUnsafeEntry means an archive entry is not a plain file or
	// directory inside the destination.
	ErrUnsafeEntry = errors.New("unsafe checkpoint entry")
	// ErrTooLarge means the archive unpacks to more than the limit.
	ErrTooLarge = errors.New("checkpoint too large")
)

// Manifest describes a checkpoint.
type Manifest struct {
	// Version is the archive format (FormatVersion).
	Version int `json:"version"`
	// Tenant and Run name the run the checkpoint was taken of.
	Tenant string `json:"tenant"`
	Run    string `json:"run"`
	// Kind is what the checkpoint keeps.
	Kind sandbox.CheckpointKind `json:"kind"`
	// Runtime is the sandbox runtime it was taken under; a restore needs
	// the same one.
	Runtime string `json:"runtime"`
	// ImageDigest is the run image's digest; a restore needs the same image.
	ImageDigest string `json:"image_digest,omitempty"`
	// Created is when the checkpoint was taken.
	Created time.Time `json:"created"`
	// StdoutOffset and StderrOffset are how many bytes of each stream the
	// run had written when it was checkpointed: the resumed run's output
	// is appended from there. The output is drained only once the sandbox
	// stopped, after the archive was packed, so the run's record holds
	// them (the archive's copy may hold zero).
	StdoutOffset int64 `json:"stdout_offset"`
	StderrOffset int64 `json:"stderr_offset"`
	// Policy is the confinement the run had when it was paused; Resume
	// refuses to restore it under a looser one (its uid may differ: a
	// resumed run leases a fresh one).
	Policy *sandbox.Policy `json:"policy,omitempty"`
	// Digest ("sha256:HEX") and Size are the archive's; Pack sets them and
	// they are not part of the archive's own copy of the manifest.
	Digest string `json:"digest,omitempty"`
	Size   int64  `json:"size,omitempty"`
}

// Pack writes dir, a checkpoint directory, to w as an archive with m as its
// manifest, and returns m with Version, Digest and Size set. dir may hold
// only regular files and directories.
func Pack(dir string, m Manifest, w io.Writer) (Manifest, error) {
	m.Version, m.Digest, m.Size = FormatVersion, "", 0
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, h)}
	zw, err := zstd.NewWriter(cw, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return m, fmt.Errorf("checkpoint: compressor: %w", err)
	}
	tw := tar.NewWriter(zw)
	raw, err := json.Marshal(m)
	if err != nil {
		return m, fmt.Errorf("checkpoint: manifest: %w", err)
	}
	if err := writeEntry(tw, ManifestName, 0o600, int64(len(raw)), strings.NewReader(string(raw))); err != nil {
		return m, err
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		name := filepath.ToSlash(rel)
		if name == ManifestName {
			return fmt.Errorf("checkpoint: %s: the name is reserved for the manifest", p)
		}
		switch {
		case d.IsDir():
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o700, Format: tar.FormatPAX})
		case d.Type().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			return writeEntry(tw, name, 0o600, fi.Size(), f)
		default:
			return fmt.Errorf("checkpoint: %s is not a regular file or directory", p)
		}
	})
	if err != nil {
		return m, fmt.Errorf("checkpoint: pack %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return m, fmt.Errorf("checkpoint: pack: %w", err)
	}
	if err := zw.Close(); err != nil {
		return m, fmt.Errorf("checkpoint: pack: %w", err)
	}
	m.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	m.Size = cw.n
	return m, nil
}

// writeEntry writes one regular file entry of size bytes from r.
func writeEntry(tw *tar.Writer, name string, mode, size int64, r io.Reader) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: size, Format: tar.FormatPAX}); err != nil {
		return fmt.Errorf("checkpoint: %s: %w", name, err)
	}
	if _, err := io.CopyN(tw, r, size); err != nil {
		return fmt.Errorf("checkpoint: %s: %w", name, err)
	}
	return nil
}

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Expect is what Unpack checks an archive against: the manifest the run's
// record kept (its Digest, Tenant and Run), and how much the archive may
// unpack to.
type Expect struct {
	// Manifest is the one Pack returned, as the run's record kept it.
	Manifest Manifest
	// MaxBytes bounds the unpacked size; 0 means no bound.
	MaxBytes int64
}

// Unpack checks the archive at archivePath against want and extracts its
// files into dst, an existing empty directory. It returns the archive's own
// manifest. Nothing is extracted unless the archive's digest is
// want.Manifest.Digest (else ErrDigest) and its manifest names the same
// tenant and run (else ErrForeign). An entry that is not a regular file or
// directory, or whose name leaves dst, fails with ErrUnsafeEntry.
func Unpack(archivePath string, want Expect, dst string) (Manifest, error) {
	got, err := fileDigest(archivePath)
	if err != nil {
		return Manifest{}, err
	}
	return unpack(archivePath, got, want, dst)
}

// unpack is Unpack of the archive at archivePath whose digest is got.
func unpack(archivePath, got string, want Expect, dst string) (Manifest, error) {
	if want.Manifest.Digest == "" || want.Manifest.Tenant == "" || want.Manifest.Run == "" {
		return Manifest{}, fmt.Errorf("checkpoint: unpack %s: the expected digest, tenant and run must be set", archivePath)
	}
	if got != want.Manifest.Digest {
		return Manifest{}, fmt.Errorf("checkpoint: %s: %w: the archive is %s, the run's record names %s; it was changed after the run was paused",
			archivePath, ErrDigest, got, want.Manifest.Digest)
	}
	f, err := os.Open(archivePath)
	if err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	zr, err := zstd.NewReader(f)
	if err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: %s: %w", archivePath, err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	m, err := readManifest(tr)
	if err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: %s: %w", archivePath, err)
	}
	if m.Tenant != want.Manifest.Tenant || m.Run != want.Manifest.Run {
		return m, fmt.Errorf("checkpoint: %s: %w: it was taken of run %q of tenant %q, not run %q of tenant %q",
			archivePath, ErrForeign, m.Run, m.Tenant, want.Manifest.Run, want.Manifest.Tenant)
	}
	if m.Version != FormatVersion {
		return m, fmt.Errorf("checkpoint: %s: format version %d, this taskrun reads %d", archivePath, m.Version, FormatVersion)
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return m, fmt.Errorf("checkpoint: unpack into %s: %w", dst, err)
	}
	defer root.Close()
	if err := extract(tr, root, want.MaxBytes); err != nil {
		return m, fmt.Errorf("checkpoint: unpack %s into %s: %w", archivePath, dst, err)
	}
	m.Digest, m.Size = want.Manifest.Digest, want.Manifest.Size
	return m, nil
}

// fileDigest returns the "sha256:HEX" digest of a file.
func fileDigest(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("checkpoint: digest %s: %w", p, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// maxManifest bounds the manifest entry.
const maxManifest = 1 << 16

// readManifest reads the archive's first entry, which must be the manifest.
func readManifest(tr *tar.Reader) (Manifest, error) {
	hdr, err := tr.Next()
	if err != nil {
		return Manifest{}, fmt.Errorf("read manifest: %w", err)
	}
	if hdr.Name != ManifestName || hdr.Typeflag != tar.TypeReg || hdr.Size > maxManifest {
		return Manifest{}, fmt.Errorf("%w: the first entry is %q, not the manifest %s", ErrUnsafeEntry, hdr.Name, ManifestName)
	}
	var m Manifest
	if err := json.NewDecoder(io.LimitReader(tr, maxManifest)).Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("parse manifest: %w", err)
	}
	return m, nil
}

// extract writes the archive's remaining entries under root.
func extract(tr *tar.Reader, root *os.Root, maxBytes int64) error {
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			total += hdr.Size
			if maxBytes > 0 && total > maxBytes {
				return fmt.Errorf("%w: more than %d bytes", ErrTooLarge, maxBytes)
			}
			if dir := path.Dir(name); dir != "." {
				if err := root.MkdirAll(dir, 0o700); err != nil {
					return err
				}
			}
			if err := writeFile(root, name, tr, hdr.Size); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: %q is of type %q; only regular files and directories are allowed", ErrUnsafeEntry, hdr.Name, hdr.Typeflag)
		}
	}
}

// entryName checks an entry's name is a relative path inside the archive
// and returns it cleaned.
func entryName(name string) (string, error) {
	clean := path.Clean(strings.TrimSuffix(name, "/"))
	if name == "" || path.IsAbs(name) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") ||
		strings.Contains(name, "\\") || clean == ManifestName || !fs.ValidPath(clean) {
		return "", fmt.Errorf("%w: name %q", ErrUnsafeEntry, name)
	}
	return clean, nil
}

// writeFile creates name under root, failing if it exists, and copies size
// bytes into it.
func writeFile(root *os.Root, name string, r io.Reader, size int64) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("%w: %q: %w", ErrUnsafeEntry, name, err)
	}
	if _, err := io.CopyN(f, r, size); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	return f.Close()
}
