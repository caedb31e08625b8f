package checkpoint_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/sandbox"
)

func manifest() checkpoint.Manifest {
	pol := sandbox.DefaultPolicy()
	pol.Runtime = sandbox.RuntimeGVisor
	return checkpoint.Manifest{Policy: &pol,
		Tenant: "alice", Run: "run-1", Kind: sandbox.CheckpointMemory, Runtime: "runsc",
		ImageDigest: "sha256:abc", Created: time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC), StdoutOffset: 42,
	}
}

// pack packs a directory holding a file and a nested one into an archive
// file and returns its path and the manifest Pack returned.
func pack(t *testing.T) (string, checkpoint.Manifest) {
	t.Helper()
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "checkpoint.img"), bytes.Repeat([]byte("memory"), 1000), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(src, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(src, "sub", "pages"), []byte("pages"), 0o644))
	archive := filepath.Join(t.TempDir(), "ck.tar.zst")
	f, err := os.Create(archive)
	require.NoError(t, err)
	m, err := checkpoint.Pack(src, manifest(), f)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return archive, m
}

func TestPackUnpackRoundTrip(t *testing.T) {
	archive, m := pack(t)
	fi, err := os.Stat(archive)
	require.NoError(t, err)
	require.Equal(t, fi.Size(), m.Size)
	require.Less(t, m.Size, int64(6000), "compressed")
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, m.Digest)

	dst := t.TempDir()
	got, err := checkpoint.Unpack(archive, checkpoint.Expect{Manifest: m}, dst)
	require.NoError(t, err)
	require.Equal(t, m, got)
	img, err := os.ReadFile(filepath.Join(dst, "checkpoint.img"))
	require.NoError(t, err)
	require.Equal(t, bytes.Repeat([]byte("memory"), 1000), img)
	pages, err := os.ReadFile(filepath.Join(dst, "sub", "pages"))
	require.NoError(t, err)
	require.Equal(t, "pages", string(pages))
	_, err = os.Stat(filepath.Join(dst, checkpoint.ManifestName))
	require.ErrorIs(t, err, os.ErrNotExist, "the manifest is not extracted")
}

func TestUnpackRefusesTamperedArchive(t *testing.T) {
	archive, m := pack(t)
	raw, err := os.ReadFile(archive)
	require.NoError(t, err)
	raw[len(raw)/2] ^= 0xff
	require.NoError(t, os.WriteFile(archive, raw, 0o644))
	dst := t.TempDir()
	_, err = checkpoint.Unpack(archive, checkpoint.Expect{Manifest: m}, dst)
	require.ErrorIs(t, err, checkpoint.ErrDigest)
	require.ErrorContains(t, err, "changed after the run was paused")
	entries, err := os.ReadDir(dst)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing is extracted from a tampered archive")
}

func TestUnpackRefusesForeignArchive(t *testing.T) {
	archive, m := pack(t) // of alice's run-1
	for _, want := range []checkpoint.Manifest{
		{Tenant: "bob", Run: m.Run, Digest: m.Digest},
		{Tenant: m.Tenant, Run: "run-2", Digest: m.Digest},
	} {
		dst := t.TempDir()
		_, err := checkpoint.Unpack(archive, checkpoint.Expect{Manifest: want}, dst)
		require.ErrorIs(t, err, checkpoint.ErrForeign)
		entries, err := os.ReadDir(dst)
		require.NoError(t, err)
		require.Empty(t, entries)
	}
}

func TestUnpackRefusesOversizedArchive(t *testing.T) {
	archive, m := pack(t)
	_, err := checkpoint.Unpack(archive, checkpoint.Expect{Manifest: m, MaxBytes: 100}, t.TempDir())
	require.ErrorIs(t, err, checkpoint.ErrTooLarge)
}

// hostile writes an archive with the manifest of alice's run-1 followed
// by hdrs (each regular file holding "x"), and returns its path and the
// manifest naming its true digest: only the entries are wrong.
func hostile(t *testing.T, hdrs ...*tar.Header) (string, checkpoint.Manifest) {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	require.NoError(t, err)
	tw := tar.NewWriter(zw)
	m := manifest()
	m.Version = checkpoint.FormatVersion
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: checkpoint.ManifestName, Size: int64(len(raw)), Mode: 0o600}))
	_, err = tw.Write(raw)
	require.NoError(t, err)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = 1
		}
		require.NoError(t, tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			_, err = tw.Write([]byte("x"))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	archive := filepath.Join(t.TempDir(), "hostile.tar.zst")
	require.NoError(t, os.WriteFile(archive, buf.Bytes(), 0o644))
	sum := sha256.Sum256(buf.Bytes())
	m.Digest = "sha256:" + hex.EncodeToString(sum[:])
	return archive, m
}

func TestUnpackRefusesHostileEntries(t *testing.T) {
	reg := func(name string) *tar.Header { return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644} }
	cases := map[string][]*tar.Header{
		"parent":          {reg("../escaped")},
		"nested parent":   {reg("a/../../escaped")},
		"absolute":        {reg("/tmp/escaped")},
		"symlink":         {{Typeflag: tar.TypeSymlink, Name: "link", Linkname: "/"}},
		"symlink to dir":  {{Typeflag: tar.TypeSymlink, Name: "up", Linkname: ".."}, reg("up/escaped")},
		"hard link":       {{Typeflag: tar.TypeLink, Name: "hard", Linkname: "/etc/passwd"}},
		"device":          {{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}},
		"fifo":            {{Typeflag: tar.TypeFifo, Name: "fifo"}},
		"duplicate":       {reg("twice"), reg("twice")},
		"second manifest": {reg(checkpoint.ManifestName)},
	}
	for name, hdrs := range cases {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "dst")
			require.NoError(t, os.Mkdir(dst, 0o755))
			archive, m := hostile(t, hdrs...)
			_, err := checkpoint.Unpack(archive, checkpoint.Expect{Manifest: m}, dst)
			require.ErrorIs(t, err, checkpoint.ErrUnsafeEntry)
			_, err = os.Lstat(filepath.Join(parent, "escaped"))
			require.ErrorIs(t, err, os.ErrNotExist, "nothing is written outside the destination")
			_, err = os.Lstat("/tmp/escaped")
			require.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

func TestUnpackNeedsTheRecordsDigest(t *testing.T) {
	archive, m := pack(t)
	m.Digest = ""
	_, err := checkpoint.Unpack(archive, checkpoint.Expect{Manifest: m}, t.TempDir())
	require.ErrorContains(t, err, "expected digest")
}
