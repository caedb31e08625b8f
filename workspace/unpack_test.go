package workspace_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// unpackFixture gives each case a dest inside its own parent and an
// "outside" directory next to it that must stay untouched.
type unpackFixture struct {
	parent, dest, outside string
}

func newUnpackFixture(t *testing.T) unpackFixture {
	t.Helper()
	parent := t.TempDir()
	f := unpackFixture{parent: parent, dest: filepath.Join(parent, "home"), outside: filepath.Join(parent, "outside")}
	require.NoError(t, os.Mkdir(f.dest, 0o755))
	require.NoError(t, os.Mkdir(f.outside, 0o755))
	return f
}

func (f unpackFixture) unpack(t *testing.T, archive []byte, opts workspace.UnpackOptions) (workspace.UnpackStats, error) {
	t.Helper()
	var (
		stats workspace.UnpackStats
		err   error
	)
	noHang(t, "UnpackHome", func() {
		stats, err = workspace.UnpackHome(context.Background(), bytes.NewReader(archive), f.dest, opts)
	})
	return stats, err
}

// requireNothingRestored asserts a rejected archive left no trace.
func (f unpackFixture) requireNothingRestored(t *testing.T) {
	t.Helper()
	requireDirEmptyOrMissing(t, f.dest)
	requireDirEmptyOrMissing(t, f.outside)
	requireNoStaging(t, f.dest)
	_, err := os.Lstat(filepath.Join(f.parent, "escaped"))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing may be written next to dest")
}

func TestUnpackHomeRejectsUnsafeEntries(t *testing.T) {
	tests := []struct {
		name    string
		entries []tarEntry
	}{
		{"dotdot slip", []tarEntry{regEntry("ok.txt", "fine"), regEntry("../escaped", "pwned")}},
		{"nested dotdot slip", []tarEntry{dirEntry("a/"), regEntry("a/../../escaped", "pwned")}},
		{"absolute path", []tarEntry{regEntry("/tmp/escaped", "pwned")}},
		{"symlink to absolute dir then file through it", []tarEntry{
			linkEntry(tar.TypeSymlink, "evil", "/tmp"),
			regEntry("evil/escaped", "pwned"),
		}},
		{"symlink to parent then file through it", []tarEntry{
			linkEntry(tar.TypeSymlink, "evil", ".."),
			regEntry("evil/escaped", "pwned"),
		}},
		{"in-tree symlink then file through it", []tarEntry{
			dirEntry("sub/"),
			linkEntry(tar.TypeSymlink, "alias", "sub"),
			regEntry("alias/file", "through a link"),
		}},
		{"symlink chain escaping", []tarEntry{
			linkEntry(tar.TypeSymlink, "self", "."),
			linkEntry(tar.TypeSymlink, "up", "self/.."),
		}},
		{"symlink loop", []tarEntry{
			linkEntry(tar.TypeSymlink, "a", "b"),
			linkEntry(tar.TypeSymlink, "b", "a"),
		}},
		{"hardlink", []tarEntry{regEntry("f", "x"), linkEntry(tar.TypeLink, "g", "f")}},
		{"hardlink to host file", []tarEntry{linkEntry(tar.TypeLink, "shadow", "/etc/shadow")}},
		{"char device", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "null", Mode: 0o666, Devmajor: 1, Devminor: 3}}}},
		{"block device", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Mode: 0o660, Devmajor: 8}}}},
		{"fifo", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "pipe", Mode: 0o644}}}},
		{"duplicate file", []tarEntry{regEntry("f", "one"), regEntry("f", "two")}},
		{"file replacing symlink", []tarEntry{linkEntry(tar.TypeSymlink, "f", "g"), regEntry("f", "x")}},
		{"file under a file", []tarEntry{regEntry("f", "x"), regEntry("f/g", "y")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newUnpackFixture(t)
			_, err := f.unpack(t, buildArchive(t, tt.entries...), workspace.UnpackOptions{})
			require.Error(t, err)
			var unsafe *workspace.UnsafeEntryError
			require.ErrorAs(t, err, &unsafe, "got %v", err)
			assert.NotEmpty(t, unsafe.Reason)
			f.requireNothingRestored(t)
		})
	}
}

func TestUnpackHomeRejectsNonEmptyDest(t *testing.T) {
	f := newUnpackFixture(t)
	writeFile(t, filepath.Join(f.dest, "existing"), "keep me", 0o644)
	_, err := f.unpack(t, buildArchive(t, regEntry("a", "b")), workspace.UnpackOptions{})
	require.Error(t, err)
	assert.FileExists(t, filepath.Join(f.dest, "existing"))
	_, err = os.Lstat(filepath.Join(f.dest, "a"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestUnpackHomeAcceptsSafeLinksAndMissingDest(t *testing.T) {
	f := newUnpackFixture(t)
	require.NoError(t, os.Remove(f.dest))
	archive := buildArchive(t,
		dirEntry("bin/"),
		regEntry("lib/tool", "#!/bin/sh\n"),
		linkEntry(tar.TypeSymlink, "bin/tool", "../lib/tool"),
		linkEntry(tar.TypeSymlink, "dangling", "not-yet-created"),
	)
	stats, err := f.unpack(t, archive, workspace.UnpackOptions{})
	require.NoError(t, err)
	assert.Equal(t, int64(1), stats.Files)
	assert.Equal(t, int64(2), stats.Symlinks)
	target, err := os.Readlink(filepath.Join(f.dest, "bin", "tool"))
	require.NoError(t, err)
	assert.Equal(t, "../lib/tool", target)
	requireNoStaging(t, f.dest)
}

// zeroBomb streams a gzip archive holding one file of size zero bytes. It is
// made of concatenated gzip members (which a gzip reader reads as one stream),
// so a 1 GiB bomb costs one compressed 1 MiB block, repeated.
func zeroBomb(t *testing.T, size int64) []byte {
	t.Helper()
	const block = 1 << 20
	require.Zero(t, size%block)
	member := func(b []byte) []byte {
		var buf bytes.Buffer
		gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		require.NoError(t, err)
		_, err = gz.Write(b)
		require.NoError(t, err)
		require.NoError(t, gz.Close())
		return buf.Bytes()
	}
	var hdr bytes.Buffer
	tw := tar.NewWriter(&hdr)
	require.NoError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Mode: 0o644, Size: size}))
	zeros := member(make([]byte, block))
	out := bytes.NewBuffer(member(hdr.Bytes()))
	for range size / block {
		out.Write(zeros)
	}
	out.Write(member(make([]byte, 1024))) // end-of-archive marker
	return out.Bytes()
}

func TestUnpackHomeStopsArchiveBomb(t *testing.T) {
	bomb := zeroBomb(t, 1<<30)
	require.Less(t, len(bomb), 2<<20, "the bomb must be small compressed")

	tests := []struct {
		name   string
		limits workspace.UnpackLimits
	}{
		{"ratio cap (defaults)", workspace.UnpackLimits{}},
		{"total cap", workspace.UnpackLimits{MaxBytes: 64 << 20, MaxRatio: 1 << 40}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newUnpackFixture(t)
			_, err := f.unpack(t, bomb, workspace.UnpackOptions{Limits: tt.limits})
			require.ErrorIs(t, err, workspace.ErrLimitExceeded)
			f.requireNothingRestored(t)
		})
	}
}

func TestUnpackHomeEnforcesEntryAndDeclaredSizeCaps(t *testing.T) {
	many := []tarEntry{}
	for _, n := range []string{"a", "b", "c", "d"} {
		many = append(many, regEntry(n, n))
	}
	big := tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "big", Mode: 0o644, Size: 1 << 20}, body: string(make([]byte, 1<<20))}
	tests := []struct {
		name    string
		entries []tarEntry
		limits  workspace.UnpackLimits
	}{
		{"entry count", many, workspace.UnpackLimits{MaxEntries: 3}},
		{"declared size", []tarEntry{big}, workspace.UnpackLimits{MaxBytes: 1000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newUnpackFixture(t)
			_, err := f.unpack(t, buildArchive(t, tt.entries...), workspace.UnpackOptions{Limits: tt.limits})
			require.ErrorIs(t, err, workspace.ErrLimitExceeded)
			f.requireNothingRestored(t)
		})
	}
}

func TestUnpackHomeRejectsCorruptStream(t *testing.T) {
	archive := buildArchive(t, regEntry("a", "hello world"), regEntry("b", "second"))
	tests := map[string][]byte{
		"not gzip":  []byte("plain text, not an archive"),
		"truncated": archive[:len(archive)/2],
	}
	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			f := newUnpackFixture(t)
			_, err := f.unpack(t, data, workspace.UnpackOptions{})
			require.Error(t, err)
			f.requireNothingRestored(t)
		})
	}
}

func TestUnpackHomeChownsToOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to the sandbox user needs root; not running as root")
	}
	f := newUnpackFixture(t)
	require.NoError(t, os.Lchown(f.dest, workspace.SandboxOwner.UID, workspace.SandboxOwner.GID))
	archive := buildArchive(t, regEntry("d/f", "x"), linkEntry(tar.TypeSymlink, "l", "d/f"))
	_, err := f.unpack(t, archive, workspace.UnpackOptions{Owner: &workspace.SandboxOwner})
	require.NoError(t, err)
	for _, p := range []string{"", "d", "d/f", "l"} {
		uid, gid := ownerOf(t, filepath.Join(f.dest, p))
		assert.Equal(t, uint32(10001), uid, p)
		assert.Equal(t, uint32(10001), gid, p)
	}
}

func TestUnpackHomeHonoursCancellation(t *testing.T) {
	f := newUnpackFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := workspace.UnpackHome(ctx, bytes.NewReader(buildArchive(t, regEntry("a", "b"))), f.dest, workspace.UnpackOptions{})
	require.ErrorIs(t, err, context.Canceled)
	f.requireNothingRestored(t)
}

// errReader fails after its data, like a broken download.
type errReader struct{ r io.Reader }

func (e errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, syscall.ECONNRESET
	}
	return n, err
}

func TestUnpackHomeFailsOnReadError(t *testing.T) {
	f := newUnpackFixture(t)
	archive := buildArchive(t, regEntry("a", "b"))
	_, err := workspace.UnpackHome(context.Background(), errReader{bytes.NewReader(archive[:len(archive)-4])}, f.dest, workspace.UnpackOptions{})
	require.ErrorIs(t, err, syscall.ECONNRESET)
	f.requireNothingRestored(t)
}
