package workspace_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// deepLevels is how deep makeDeepTree nests: a few levels past MaxDepth.
const deepLevels = workspace.MaxDepth + 5

// deepDir is the slash path of the directory nested depth levels down.
func deepDir(depth int) string {
	return strings.TrimSuffix(strings.Repeat("d/", depth), "/")
}

// makeDeepTree nests directories "d" deepLevels levels below dir, with a file
// "f" in dir and in every directory. It returns how many files and
// directories lie within MaxDepth levels.
func makeDeepTree(t *testing.T, dir string) (files, dirs int64) {
	t.Helper()
	for depth := 0; depth <= deepLevels; depth++ {
		p := filepath.Join(dir, filepath.FromSlash(deepDir(depth)))
		require.NoError(t, os.MkdirAll(p, 0o755))
		writeFile(t, filepath.Join(p, "f"), fmt.Sprintf("level %d", depth), 0o644)
	}
	return workspace.MaxDepth, workspace.MaxDepth
}

// requireDepthSkip asserts that exactly the contents of the directory
// MaxDepth levels down were skipped, with a reason naming the limit.
func requireDepthSkip(t *testing.T, skips []workspace.Skip) {
	t.Helper()
	require.Len(t, skips, 1)
	assert.Equal(t, deepDir(workspace.MaxDepth), skips[0].Path)
	assert.Contains(t, skips[0].Reason, "MaxDepth")
}

func TestPackHomeSkipsBeyondMaxDepth(t *testing.T) {
	home := t.TempDir()
	files, dirs := makeDeepTree(t, home)

	archive, stats := packHome(t, home, workspace.PackOptions{}, hangTimeout)
	assert.Equal(t, files, stats.Files)
	assert.Equal(t, dirs, stats.Dirs)
	requireDepthSkip(t, stats.Skipped)
	for _, name := range archiveNames(t, archive) {
		depth := strings.Count(strings.TrimSuffix(name, "/"), "/") + 1
		require.LessOrEqual(t, depth, workspace.MaxDepth, name)
	}

	dest := filepath.Join(t.TempDir(), "home")
	var err error
	noHang(t, "UnpackHome", func() {
		_, err = workspace.UnpackHome(context.Background(), bytes.NewReader(archive), dest, workspace.UnpackOptions{})
	})
	require.NoError(t, err, "whatever PackHome writes must restore")
	_, err = os.Stat(filepath.Join(dest, deepDir(workspace.MaxDepth)))
	require.NoError(t, err, "the directory at MaxDepth is kept")
	_, err = os.Lstat(filepath.Join(dest, deepDir(workspace.MaxDepth), "f"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestCollectSkipsBeyondMaxDepth(t *testing.T) {
	root := t.TempDir()
	files, _ := makeDeepTree(t, root)

	got, report, err := collectAll(t, root, workspace.CollectOptions{})
	require.NoError(t, err)
	assert.Equal(t, files, report.Files)
	require.Len(t, got, int(files))
	assert.Equal(t, fmt.Sprintf("level %d", workspace.MaxDepth-1), got[path.Join(deepDir(workspace.MaxDepth-1), "f")])
	requireDepthSkip(t, report.Skipped)
}

func TestCopyTreeSkipsBeyondMaxDepth(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	files, dirs := makeDeepTree(t, src)

	stats := copyTree(t, src, dst, workspace.CopyOptions{}, hangTimeout)
	assert.Equal(t, files, stats.Files)
	assert.Equal(t, dirs, stats.Dirs)
	requireDepthSkip(t, stats.Skipped)
	entries, err := os.ReadDir(filepath.Join(dst, deepDir(workspace.MaxDepth)))
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing below MaxDepth is copied")
}

// makeLongPath nests directories with 200-byte names below dir until the
// path relative to dir is longer than MaxPathBytes, creating each through
// the previous one so no absolute path exceeds the kernel's limit. It
// returns the relative path of the first directory over the limit.
func makeLongPath(t *testing.T, dir string) string {
	t.Helper()
	name := strings.Repeat("x", 200)
	root, err := os.OpenRoot(dir)
	require.NoError(t, err)
	rel := ""
	for len(rel) <= workspace.MaxPathBytes {
		require.NoError(t, root.Mkdir(name, 0o755))
		child, err := root.OpenRoot(name)
		require.NoError(t, err)
		require.NoError(t, root.Close())
		root, rel = child, path.Join(rel, name)
	}
	require.NoError(t, root.Close())
	return rel
}

func TestPackHomeSkipsPathsOverMaxPathBytes(t *testing.T) {
	home := t.TempDir()
	tooLong := makeLongPath(t, home)

	archive, stats := packHome(t, home, workspace.PackOptions{}, hangTimeout)
	require.Len(t, stats.Skipped, 1)
	assert.Equal(t, tooLong, stats.Skipped[0].Path)
	assert.Contains(t, stats.Skipped[0].Reason, "MaxPathBytes")
	for _, name := range archiveNames(t, archive) {
		require.LessOrEqual(t, len(strings.TrimSuffix(name, "/")), workspace.MaxPathBytes)
	}
	assert.Equal(t, int64(strings.Count(tooLong, "/")), stats.Dirs)

	dest := filepath.Join(t.TempDir(), "home")
	var err error
	noHang(t, "UnpackHome", func() {
		_, err = workspace.UnpackHome(context.Background(), bytes.NewReader(archive), dest, workspace.UnpackOptions{})
	})
	require.NoError(t, err, "whatever PackHome writes must restore")
}

func TestUnpackHomeRejectsTooDeepOrLongNames(t *testing.T) {
	longDirs := strings.Repeat(strings.Repeat("x", 100)+"/", workspace.MaxPathBytes/101+1)
	tests := []struct {
		name    string
		entries []tarEntry
	}{
		{"file past MaxDepth", []tarEntry{regEntry("ok", "fine"), regEntry(deepDir(workspace.MaxDepth)+"/f", "deep")}},
		{"directory past MaxDepth", []tarEntry{dirEntry(deepDir(workspace.MaxDepth+1) + "/")}},
		{"symlink past MaxDepth", []tarEntry{linkEntry(tar.TypeSymlink, deepDir(workspace.MaxDepth)+"/l", "f")}},
		{"name over MaxPathBytes", []tarEntry{regEntry(longDirs+"f", "long")}},
		{"one huge component", []tarEntry{regEntry(strings.Repeat("y", 1<<16), "long")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newUnpackFixture(t)
			_, err := f.unpack(t, buildArchive(t, tt.entries...), workspace.UnpackOptions{})
			require.ErrorIs(t, err, workspace.ErrLimitExceeded)
			f.requireNothingRestored(t)
		})
	}
}

func TestUnpackHomeAcceptsNamesAtTheLimits(t *testing.T) {
	deepest := deepDir(workspace.MaxDepth-1) + "/f"
	longest := strings.Repeat(strings.Repeat("z", 200)+"/", 20) + strings.Repeat("z", workspace.MaxPathBytes-20*201)
	require.Len(t, longest, workspace.MaxPathBytes)
	f := newUnpackFixture(t)
	stats, err := f.unpack(t, buildArchive(t, regEntry(deepest, "deep"), dirEntry(longest+"/")), workspace.UnpackOptions{})
	require.NoError(t, err)
	assert.Equal(t, int64(1), stats.Files)
	b, err := os.ReadFile(filepath.Join(f.dest, deepest))
	require.NoError(t, err)
	assert.Equal(t, "deep", string(b))
}

// makeFIFOs creates n FIFOs in dir.
func makeFIFOs(t *testing.T, dir string, n int) {
	t.Helper()
	for i := range n {
		require.NoError(t, syscall.Mkfifo(filepath.Join(dir, fmt.Sprintf("fifo%05d", i)), 0o644))
	}
}

// requireSkipsCapped asserts that a report listing skips holds MaxSkips of
// them and counts the extra ones.
func requireSkipsCapped(t *testing.T, skips []workspace.Skip, dropped int64, extra int) {
	t.Helper()
	require.Len(t, skips, workspace.MaxSkips)
	assert.Equal(t, int64(extra), dropped)
	assert.Equal(t, "fifo00000", skips[0].Path)
	assert.Contains(t, skips[0].Reason, "FIFO")
}

func TestSkipListsAreCapped(t *testing.T) {
	const extra = 3
	dir := t.TempDir()
	makeFIFOs(t, dir, workspace.MaxSkips+extra)
	writeFile(t, filepath.Join(dir, "zz-kept.txt"), "after the skips", 0o644)

	t.Run("PackHome", func(t *testing.T) {
		archive, stats := packHome(t, dir, workspace.PackOptions{}, hangTimeout)
		requireSkipsCapped(t, stats.Skipped, stats.DroppedSkips, extra)
		assert.Equal(t, []string{"zz-kept.txt"}, archiveNames(t, archive))
	})
	t.Run("Collect", func(t *testing.T) {
		got, report, err := collectAll(t, dir, workspace.CollectOptions{})
		require.NoError(t, err)
		requireSkipsCapped(t, report.Skipped, report.DroppedSkips, extra)
		assert.Equal(t, map[string]string{"zz-kept.txt": "after the skips"}, got)
	})
	t.Run("CopyTree", func(t *testing.T) {
		dst := t.TempDir()
		stats := copyTree(t, dir, dst, workspace.CopyOptions{}, hangTimeout)
		requireSkipsCapped(t, stats.Skipped, stats.DroppedSkips, extra)
		assert.Equal(t, int64(1), stats.Files)
	})
}
