package workspace_test

import (
	"context"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// copyTree runs CopyTree, failing the test if it takes longer than limit.
func copyTree(t *testing.T, src, dst string, opts workspace.CopyOptions, limit time.Duration) workspace.CopyStats {
	t.Helper()
	var (
		stats workspace.CopyStats
		err   error
	)
	returnsWithin(t, limit, "CopyTree", func() {
		stats, err = workspace.CopyTree(context.Background(), src, dst, opts)
	})
	require.NoError(t, err)
	return stats
}

func TestCopyTreePreservesContentModesAndTimes(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	makeTree(t, src, 500)
	stats := copyTree(t, src, dst, workspace.CopyOptions{Workers: 3}, bulkTimeout)
	assert.Equal(t, int64(500), stats.Files)
	assert.Equal(t, int64(2), stats.Symlinks)
	assert.Empty(t, stats.Skipped)
	require.Equal(t, snapshot(t, src), snapshot(t, dst))

	si, err := os.Stat(filepath.Join(src, "d03"))
	require.NoError(t, err)
	di, err := os.Stat(filepath.Join(dst, "d03"))
	require.NoError(t, err)
	assert.Equal(t, si.Mode().Perm(), di.Mode().Perm())
	assert.Equal(t, si.ModTime(), di.ModTime())
}

func TestCopyTreeSkipsHostileEntries(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	canary := makeCanary(t)
	writeFile(t, filepath.Join(src, "ok.txt"), "legit", 0o644)
	require.NoError(t, os.Symlink(canary, filepath.Join(src, "abs")))
	require.NoError(t, os.Symlink("../../"+filepath.Base(canary), filepath.Join(src, "up")))
	require.NoError(t, os.Symlink("/etc", filepath.Join(src, "etc")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644))
	l, err := net.Listen("unix", filepath.Join(src, "sock"))
	require.NoError(t, err)
	defer l.Close()

	stats := copyTree(t, src, dst, workspace.CopyOptions{}, hangTimeout)
	reasons := skipReasons(stats.Skipped)
	assert.Contains(t, reasons["abs"], "absolute")
	assert.Contains(t, reasons["up"], "leaves the tree")
	assert.Contains(t, reasons["etc"], "absolute")
	assert.Contains(t, reasons["fifo"], "FIFO")
	assert.Contains(t, reasons["sock"], "socket")
	assert.Equal(t, map[string]treeEntry{"ok.txt": snapshot(t, src)["ok.txt"]}, snapshot(t, dst))
}

func TestCopyTreeChownsToOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to the sandbox user needs root; not running as root")
	}
	src, dst := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(src, "d", "f"), "x", 0o600)
	require.NoError(t, os.Symlink("d/f", filepath.Join(src, "l")))
	copyTree(t, src, dst, workspace.CopyOptions{Owner: &workspace.SandboxOwner}, hangTimeout)
	for _, p := range []string{"d", "d/f", "l"} {
		uid, gid := ownerOf(t, filepath.Join(dst, p))
		assert.Equal(t, uint32(10001), uid, p)
		assert.Equal(t, uint32(10001), gid, p)
	}
}

func TestCopyTreeExistingDestinationEntries(t *testing.T) {
	tests := []struct {
		name string
		keep bool
	}{
		{"replace", false},
		{"keep existing", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst := t.TempDir(), t.TempDir()
			canary := makeCanary(t)
			writeFile(t, filepath.Join(src, "a"), "from src", 0o644)
			writeFile(t, filepath.Join(src, "b"), "from src", 0o644)
			writeFile(t, filepath.Join(src, "sub", "f"), "from src", 0o644)
			writeFile(t, filepath.Join(src, "merged", "new"), "from src", 0o644)
			writeFile(t, filepath.Join(dst, "a"), "restored", 0o644)
			require.NoError(t, os.Symlink(canary, filepath.Join(dst, "b")))
			require.NoError(t, os.Symlink(filepath.Dir(canary), filepath.Join(dst, "sub")))
			writeFile(t, filepath.Join(dst, "merged", "old"), "restored", 0o644)

			stats := copyTree(t, src, dst, workspace.CopyOptions{KeepExisting: tt.keep}, hangTimeout)

			got, err := os.ReadFile(canary)
			require.NoError(t, err)
			assert.Equal(t, canaryContent, string(got), "never write through a destination symlink")
			assert.NoFileExists(t, filepath.Join(filepath.Dir(canary), "f"))
			assert.FileExists(t, filepath.Join(dst, "merged", "old"))
			assert.FileExists(t, filepath.Join(dst, "merged", "new"))
			snap := snapshot(t, dst)
			if tt.keep {
				assert.Equal(t, "restored", snap["a"].Content)
				assert.Equal(t, canary, snap["b"].Target)
				assert.Equal(t, filepath.Dir(canary), snap["sub"].Target)
				assert.ElementsMatch(t, []string{"a", "b", "sub"}, slices.Collect(maps.Keys(skipReasons(stats.Skipped))))
				return
			}
			assert.Equal(t, "from src", snap["a"].Content)
			assert.Equal(t, "from src", snap["b"].Content)
			assert.Equal(t, "from src", snap["sub/f"].Content)
			assert.Empty(t, stats.Skipped)
		})
	}
}

func TestCopyTreeIntoItsOwnSubdirectory(t *testing.T) {
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "a", "f"), "x", 0o644)
	dst := filepath.Join(src, "z-home")
	require.NoError(t, os.Mkdir(dst, 0o755))
	stats := copyTree(t, src, dst, workspace.CopyOptions{}, hangTimeout)
	assert.Contains(t, skipReasons(stats.Skipped)["z-home"], "destination itself")
	assert.FileExists(t, filepath.Join(dst, "a", "f"))
	assert.NoDirExists(t, filepath.Join(dst, "z-home"))

	_, err := workspace.CopyTree(context.Background(), src, src, workspace.CopyOptions{})
	require.Error(t, err)
}

func TestCopyTreeNeedsExistingDestination(t *testing.T) {
	_, err := workspace.CopyTree(context.Background(), t.TempDir(), filepath.Join(t.TempDir(), "missing"), workspace.CopyOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "create it first")
}
