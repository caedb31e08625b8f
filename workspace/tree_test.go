package workspace_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fileModes cycles through the permission bits given to generated files.
var fileModes = []fs.FileMode{0o600, 0o644, 0o755, 0o400, 0o640}

// makeTree fills dir with n small files spread over nested directories
// (20 top-level dirs with 5 subdirs each), varied modes and mtimes, an in-tree
// file symlink and an in-tree directory symlink.
func makeTree(tb testing.TB, dir string, n int) {
	tb.Helper()
	base := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range n {
		sub := filepath.Join(dir, fmt.Sprintf("d%02d", i%20), fmt.Sprintf("s%d", (i/20)%5))
		if i < 100 {
			require.NoError(tb, os.MkdirAll(sub, 0o755))
		}
		p := filepath.Join(sub, fmt.Sprintf("f%05d.txt", i))
		content := strings.Repeat(fmt.Sprintf("file %d\n", i), 1+i%7)
		require.NoError(tb, os.WriteFile(p, []byte(content), 0o600))
		require.NoError(tb, os.Chmod(p, fileModes[i%len(fileModes)]))
		mtime := base.Add(time.Duration(i) * time.Second)
		require.NoError(tb, os.Chtimes(p, mtime, mtime))
	}
	require.NoError(tb, os.Chmod(filepath.Join(dir, "d03"), 0o750))
	require.NoError(tb, os.Symlink("d00/s0/f00000.txt", filepath.Join(dir, "first")))
	require.NoError(tb, os.Symlink("../d02", filepath.Join(dir, "d01", "sibling")))
}
