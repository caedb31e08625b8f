package kubernetes

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/helpers/podhelper"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workspace"
)

// TestMountsRoundTrip sends mounts through the fill stream into a stand-in
// data volume as the fill container does, changes the copy as a run would,
// and syncs it back as Wait does.
func TestMountsRoundTrip(t *testing.T) {
	ctx := context.Background()
	runDir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(runDir, "home", "src"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(runDir, "home", "src", "a.go"), []byte("package a\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(runDir, "home", "gone.txt"), []byte("delete me"), 0o644))
	helper := filepath.Join(t.TempDir(), "taskrun-probe")
	require.NoError(t, os.WriteFile(helper, []byte("#!probe"), 0o555))
	// A socket the executor owns in the run dir never crosses and survives.
	sock := filepath.Join(runDir, "gateway.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer l.Close()

	mounts := []sandbox.Mount{{Source: runDir, Target: "/taskrun"}, {Source: helper, Target: "/.taskrun/bin/taskrun-probe", ReadOnly: true}}
	var stream bytes.Buffer
	require.NoError(t, writeFillStream(ctx, &stream, mounts))
	data, bin := t.TempDir(), t.TempDir()
	require.NoError(t, podhelper.Fill(ctx, &stream, data, bin))

	m0, m1 := filepath.Join(data, "m0"), filepath.Join(data, "m1")
	got, err := os.ReadFile(filepath.Join(m0, "home", "src", "a.go"))
	require.NoError(t, err)
	assert.Equal(t, "package a\n", string(got))
	assert.NoFileExists(t, filepath.Join(m0, "gateway.sock"))
	info, err := os.Stat(m1)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o555), info.Mode().Perm())
	self, err := os.Stat(filepath.Join(bin, podhelper.Name))
	require.NoError(t, err)
	assert.True(t, self.Mode().IsRegular() && self.Size() > 0, "fill copies the helper for the run container")

	// The run changes its copy.
	require.NoError(t, os.Remove(filepath.Join(m0, "home", "gone.txt")))
	require.NoError(t, os.WriteFile(filepath.Join(m0, "home", "new.txt"), []byte("made in the pod"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(m0, "gateway.sock"), []byte("not a socket"), 0o644))

	var archive bytes.Buffer
	_, err = workspace.PackHome(ctx, m0, &archive, workspace.PackOptions{})
	require.NoError(t, err)
	require.NoError(t, syncInto(ctx, &archive, runDir, DefaultDiskBytes))

	got, err = os.ReadFile(filepath.Join(runDir, "home", "new.txt"))
	require.NoError(t, err)
	assert.Equal(t, "made in the pod", string(got))
	assert.NoFileExists(t, filepath.Join(runDir, "home", "gone.txt"), "a file the run deleted is deleted on the host")
	fi, err := os.Lstat(sock)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, fi.Mode().Type(), "the Pod's file must not replace the executor's socket")
	entries, err := os.ReadDir(runDir)
	require.NoError(t, err)
	for _, e := range entries {
		assert.NotContains(t, e.Name(), outPrefix, "staging left behind")
	}
}

// TestSyncIntoRefusesHostileArchive checks an archive escaping the run dir
// changes nothing on the host.
func TestSyncIntoRefusesHostileArchive(t *testing.T) {
	runDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(runDir, "keep.txt"), []byte("kept"), 0o644))
	outside := t.TempDir()
	archive := hostileArchive(t, "../"+filepath.Base(outside)+"/pwned")
	err := syncInto(context.Background(), bytes.NewReader(archive), runDir, DefaultDiskBytes)
	require.Error(t, err)
	assert.FileExists(t, filepath.Join(runDir, "keep.txt"), "a refused archive must leave the run dir as it was")
	assert.NoFileExists(t, filepath.Join(outside, "pwned"))
}

// TestCompressibleOutputIsCopiedOutWithinTheVolume copies a home holding a
// 20 MB repetitive file (about 1000:1 under gzip) back from a stand-in data
// volume: it arrives whole, since the volume's size is the bound and no
// ratio is refused under it. An archive holding more than the volume could
// is refused, and the host directory keeps what it had.
func TestCompressibleOutputIsCopiedOutWithinTheVolume(t *testing.T) {
	ctx := context.Background()
	volume := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(volume, "home"), 0o755))
	zeros := bytes.Repeat([]byte("z"), 20<<20)
	require.NoError(t, os.WriteFile(filepath.Join(volume, "home", "big.txt"), zeros, 0o644))
	pack := func() *bytes.Buffer {
		var archive bytes.Buffer
		_, err := workspace.PackHome(ctx, volume, &archive, workspace.PackOptions{})
		require.NoError(t, err)
		return &archive
	}
	archive := pack()
	require.Greater(t, int64(len(zeros))/int64(archive.Len()), workspace.DefaultUnpackLimits.MaxRatio,
		"the archive must be more compressible than the default ratio cap")

	runDir := t.TempDir()
	require.NoError(t, syncInto(ctx, archive, runDir, 64<<20))
	got, err := os.ReadFile(filepath.Join(runDir, "home", "big.txt"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(zeros, got), "the file came back whole")

	small := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(small, "keep.txt"), []byte("kept"), 0o644))
	err = syncInto(ctx, pack(), small, 16<<20)
	require.ErrorIs(t, err, workspace.ErrLimitExceeded, "more than the volume holds is refused")
	assert.FileExists(t, filepath.Join(small, "keep.txt"), "a refused copy leaves the host directory as it was")
	assert.NoFileExists(t, filepath.Join(small, "home", "big.txt"))
}

// TestFillRefusesTruncatedStream checks a cut stream fails the fill.
func TestFillRefusesTruncatedStream(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), bytes.Repeat([]byte("x"), 1<<16), 0o644))
	var stream bytes.Buffer
	require.NoError(t, writeFillStream(context.Background(), &stream, []sandbox.Mount{{Source: dir, Target: "/w"}}))
	cut := io.LimitReader(&stream, int64(stream.Len()-3))
	err := podhelper.Fill(context.Background(), cut, t.TempDir(), t.TempDir())
	require.ErrorIs(t, err, podhelper.ErrTruncated)
}

// hostileArchive is a gzip-compressed tar with one file at name.
func hostileArchive(t *testing.T, name string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	require.NoError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: 4}))
	_, err := tw.Write([]byte("evil"))
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	return buf.Bytes()
}

func TestFindSocketsServesTheExecutorsSockets(t *testing.T) {
	dir, err := os.MkdirTemp("", "fs")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	listen := func(rel string) {
		p := filepath.Join(dir, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		l, err := net.Listen("unix", p)
		require.NoError(t, err)
		t.Cleanup(func() { l.Close() })
	}
	listen(".gateway/gw.sock")
	listen("home/a/b/deep.sock") // below the depth the executor uses: the agent's own
	got, err := findSockets([]sandbox.Mount{{Source: "/nonexistent", Target: "/x"}, {Source: dir, Target: "/taskrun"}, {Source: dir, Target: "/ro", ReadOnly: true}})
	require.NoError(t, err)
	assert.Equal(t, []podSocket{{Host: filepath.Join(dir, ".gateway", "gw.sock"), Pod: podhelper.DataDir + "/m1/.gateway/gw.sock"}}, got)
}
