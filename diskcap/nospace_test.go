package diskcap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cap has an inode per 4 KiB block, whatever its size: a 1 GiB cap holds
// a workspace of 100,000 small files (ext4's default gives it 65,536).
func TestMountHasAnInodePerBlock(t *testing.T) {
	for _, size := range []int64{capSize, 1 << 30} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			dir := newRunDir(t)
			unmount, err := Mount(context.Background(), dir, size, WithTemplates(filepath.Join(t.TempDir(), "templates")))
			if errors.Is(err, ErrUnsupported) {
				t.Skipf("loop mounts unavailable here: %v", err)
			}
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, unmount()) })
			var st syscall.Statfs_t
			require.NoError(t, syscall.Statfs(dir, &st))
			assert.GreaterOrEqual(t, int64(st.Files), size/4096*9/10, "inodes of a %d-byte cap", size)
		})
	}
}

// A cap out of inodes says so, with its numbers, instead of a bare ENOSPC.
func TestExplainNamesInodes(t *testing.T) {
	dir := newRunDir(t)
	mountOrSkip(t, dir)
	var werr error
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%d", i)))
		if err != nil {
			werr = err
			break
		}
		require.NoError(t, f.Close())
		require.Less(t, i, 1<<20, "a 16 MiB cap never ran out of inodes")
	}
	require.ErrorIs(t, werr, syscall.ENOSPC)
	err := Explain(dir, fmt.Errorf("copy workspace: %w", werr))
	assert.ErrorIs(t, err, ErrNoInodes)
	assert.ErrorIs(t, err, syscall.ENOSPC)
	assert.Contains(t, err.Error(), "inodes")

	other := errors.New("something else")
	assert.Equal(t, other, Explain(dir, other))
}
