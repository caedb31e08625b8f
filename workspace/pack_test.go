package workspace_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// packHome runs PackHome, failing the test if it takes longer than limit.
func packHome(t *testing.T, home string, opts workspace.PackOptions, limit time.Duration) ([]byte, workspace.PackStats) {
	t.Helper()
	var (
		buf   bytes.Buffer
		stats workspace.PackStats
		err   error
	)
	returnsWithin(t, limit, "PackHome", func() {
		stats, err = workspace.PackHome(context.Background(), home, &buf, opts)
	})
	require.NoError(t, err)
	assert.Equal(t, int64(buf.Len()), stats.CompressedBytes)
	return buf.Bytes(), stats
}

// archiveNames lists the entry names of a gzip-compressed tar.
func archiveNames(t *testing.T, archive []byte) []string {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(archive))
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	var names []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		require.NoError(t, err)
		names = append(names, hdr.Name)
	}
}

func TestPackUnpackRoundTrip(t *testing.T) {
	home := t.TempDir()
	makeTree(t, home, 10_000)
	long := filepath.Join(home, strings.Repeat("long-directory-name-", 8), strings.Repeat("x", 120)+".txt")
	writeFile(t, long, "long path needs PAX headers", 0o640)
	writeFile(t, filepath.Join(home, "ünïcödé ✓.txt"), "utf-8 name", 0o600)
	archive, stats := packHome(t, home, workspace.PackOptions{}, bulkTimeout)
	assert.Equal(t, int64(10_002), stats.Files)
	assert.Equal(t, int64(2), stats.Symlinks)
	assert.Empty(t, stats.Skipped)

	dest := filepath.Join(t.TempDir(), "home")
	var ustats workspace.UnpackStats
	var err error
	returnsWithin(t, bulkTimeout, "UnpackHome", func() {
		ustats, err = workspace.UnpackHome(context.Background(), bytes.NewReader(archive), dest, workspace.UnpackOptions{})
	})
	require.NoError(t, err)
	assert.Equal(t, stats.Files, ustats.Files)
	assert.Equal(t, stats.Bytes, ustats.Bytes)

	want, got := snapshot(t, home), snapshot(t, dest)
	require.Len(t, got, len(want))
	require.Equal(t, want, got)

	for _, dir := range []string{"d03", "d07/s2"} {
		wi, err := os.Stat(filepath.Join(home, dir))
		require.NoError(t, err)
		gi, err := os.Stat(filepath.Join(dest, dir))
		require.NoError(t, err)
		assert.Equal(t, wi.ModTime().Unix(), gi.ModTime().Unix(), "mtime of %s", dir)
	}
}

func TestPackHomeExcludes(t *testing.T) {
	home := t.TempDir()
	for _, p := range []string{
		"keep.txt", "src/main.go", "src/app.sock.txt",
		".cache/pip/x", "proj/.cache/y",
		"proj/node_modules/.cache/z", "proj/node_modules/lib/index.js",
		"run/agent.sock", ".gateway/token",
	} {
		writeFile(t, filepath.Join(home, p), "data", 0o644)
	}
	tests := []struct {
		name     string
		exclude  []string
		want     []string
		excluded int64
	}{
		{
			name:    "defaults",
			exclude: workspace.DefaultExcludes,
			want: []string{
				"keep.txt", "src/", "src/main.go", "src/app.sock.txt",
				"proj/", "proj/node_modules/", "proj/node_modules/lib/", "proj/node_modules/lib/index.js", "run/",
			},
			excluded: 5,
		},
		{
			name:    "anchored pattern only matches at the top",
			exclude: []string{"/.cache", "/proj/node_modules"},
			want: []string{
				".gateway/", ".gateway/token", "keep.txt", "src/", "src/main.go", "src/app.sock.txt",
				"proj/", "proj/.cache/", "proj/.cache/y", "run/", "run/agent.sock",
			},
			excluded: 2,
		},
		{
			name:    "multi-component glob",
			exclude: []string{"src/*.go", "*/agent.*"},
			want: []string{
				".cache/", ".cache/pip/", ".cache/pip/x", ".gateway/", ".gateway/token", "keep.txt",
				"src/", "src/app.sock.txt", "proj/", "proj/.cache/", "proj/.cache/y",
				"proj/node_modules/", "proj/node_modules/.cache/", "proj/node_modules/.cache/z",
				"proj/node_modules/lib/", "proj/node_modules/lib/index.js", "run/",
			},
			excluded: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			archive, stats := packHome(t, home, workspace.PackOptions{Exclude: tt.exclude}, hangTimeout)
			assert.ElementsMatch(t, tt.want, archiveNames(t, archive))
			assert.Equal(t, tt.excluded, stats.Excluded)
		})
	}
}

func TestPackHomeRejectsBadPattern(t *testing.T) {
	_, err := workspace.PackHome(context.Background(), t.TempDir(), io.Discard, workspace.PackOptions{Exclude: []string{"[unclosed"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "[unclosed")
}

func TestPackHomeSkipsHostileEntries(t *testing.T) {
	home := t.TempDir()
	canary := makeCanary(t)
	writeFile(t, filepath.Join(home, "ok.txt"), "legit", 0o644)
	require.NoError(t, os.Symlink(canary, filepath.Join(home, "abs-link")))
	require.NoError(t, os.Symlink("../"+filepath.Base(filepath.Dir(canary)), filepath.Join(home, "up-link")))
	require.NoError(t, os.Symlink(filepath.Dir(canary), filepath.Join(home, "dir-link")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(home, "fifo"), 0o644))
	l, err := net.Listen("unix", filepath.Join(home, "s"))
	require.NoError(t, err)
	defer l.Close()
	haveDevice := os.Geteuid() == 0 && syscall.Mknod(filepath.Join(home, "null"), syscall.S_IFCHR|0o666, 1<<8|3) == nil

	archive, stats := packHome(t, home, workspace.PackOptions{}, hangTimeout)

	reasons := skipReasons(stats.Skipped)
	assert.Contains(t, reasons["abs-link"], "absolute")
	assert.Contains(t, reasons["up-link"], "leaves the tree")
	assert.Contains(t, reasons["dir-link"], "absolute")
	assert.Contains(t, reasons["fifo"], "FIFO")
	assert.Contains(t, reasons["s"], "socket")
	if haveDevice {
		assert.Contains(t, reasons["null"], "character device")
	}
	assert.Equal(t, []string{"ok.txt"}, archiveNames(t, archive))
	assert.NotContains(t, string(archive), canaryContent)

	dest := filepath.Join(t.TempDir(), "home")
	_, err = workspace.UnpackHome(context.Background(), bytes.NewReader(archive), dest, workspace.UnpackOptions{})
	require.NoError(t, err, "whatever PackHome writes must restore")
}

func TestPackHomeCaps(t *testing.T) {
	home := t.TempDir()
	writeFile(t, filepath.Join(home, "a"), "12345", 0o644)
	writeFile(t, filepath.Join(home, "b"), "1234567890", 0o644)
	writeFile(t, filepath.Join(home, "c"), "1", 0o644)
	writeFile(t, filepath.Join(home, "d"), "2", 0o644)

	archive, stats := packHome(t, home, workspace.PackOptions{MaxBytes: 8, MaxEntries: 2}, hangTimeout)
	assert.Equal(t, []string{"a", "c"}, archiveNames(t, archive))
	reasons := skipReasons(stats.Skipped)
	assert.Contains(t, reasons["b"], "archive cap")
	assert.Contains(t, reasons["d"], "entry cap")
}
