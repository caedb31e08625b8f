package diskcap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// One fallocate far larger than the cap fails with ENOSPC on a mounted cap:
// the host never holds more than the image's size.
//
// Without the kernel's cap (the watchdog alone), the call allocates the
// whole 1 GiB at once, before any poll can see it.
func TestMountRefusesAFallocateOverTheCap(t *testing.T) {
	dir := newRunDir(t)
	mountOrSkip(t, dir)
	f, err := os.Create(filepath.Join(dir, "big"))
	require.NoError(t, err)
	defer f.Close()
	err = syscall.Fallocate(int(f.Fd()), 0, 0, 1<<30)
	require.ErrorIs(t, err, syscall.ENOSPC)
	// FALLOC_FL_KEEP_SIZE allocates past the end of the file: refused too.
	err = syscall.Fallocate(int(f.Fd()), 1, 0, 1<<30)
	require.ErrorIs(t, err, syscall.ENOSPC)
	assert.LessOrEqual(t, allocated(t, imagePath(dir)), int64(capSize+ImageOverhead))
}

// Keep leaves a plain directory (no mount, no image) holding what the run
// wrote, read as collection reads it: a sparse file and the extra links of
// a hard-linked file are skipped with a reason, so the copy takes no more
// than what was really allocated under the cap.
//
// Without the ledger, the copy reads the 1 GiB of holes and copies the
// 4 MiB file forty times.
func TestKeepCopiesOutWhatWasAllocated(t *testing.T) {
	dir := newRunDir(t)
	unmount, err := Mount(context.Background(), dir, capSize)
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("loop mounts unavailable here: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = Release(dir) })

	require.NoError(t, os.MkdirAll(filepath.Join(dir, "home", "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "home", "sub", "notes.md"), []byte("kept"), 0o644))
	linked := filepath.Join(dir, "home", "linked.bin")
	require.NoError(t, os.WriteFile(linked, bytes.Repeat([]byte{7}, 4<<20), 0o644))
	for i := range 40 {
		require.NoError(t, os.Link(linked, filepath.Join(dir, "home", fmt.Sprintf("link%02d", i))))
	}
	f, err := os.Create(filepath.Join(dir, "home", "holes.img"))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(1<<30))
	require.NoError(t, f.Close())
	require.NoError(t, os.Symlink("/etc/shadow", filepath.Join(dir, "home", "shadow")))

	stats, err := Keep(context.Background(), dir, unmount, capSize)
	require.NoError(t, err)

	mounted, err := isMountPoint(dir)
	require.NoError(t, err)
	assert.False(t, mounted, "the kept dir holds no mount")
	assert.NoFileExists(t, imagePath(dir))
	assert.NoDirExists(t, filepath.Join(filepath.Dir(dir), ".run-1.kept"))
	got, err := os.ReadFile(filepath.Join(dir, "home", "sub", "notes.md"))
	require.NoError(t, err)
	assert.Equal(t, "kept", string(got))
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o777), fi.Mode().Perm())

	reasons := map[string]string{}
	for _, s := range stats.Skipped {
		reasons[s.Path] = s.Reason
	}
	assert.Contains(t, reasons["home/holes.img"], "sparse file")
	assert.Contains(t, reasons["home/shadow"], "absolute path")
	links := 0
	for _, r := range reasons {
		if strings.HasPrefix(r, "hard link to a file already read as ") {
			links++
		}
	}
	assert.Equal(t, 40, links, "every link but the first is skipped")
	used, err := Usage(dir)
	require.NoError(t, err)
	assert.LessOrEqual(t, used, int64(capSize), "the kept copy is no larger than the cap")
	assert.LessOrEqual(t, stats.Bytes, workspace.SparseAllowance+4<<20+int64(len("kept")))
}

// Keep leaves a run dir that has no mount (capped by the watchdog) as it is.
func TestKeepLeavesAnUnmountedDirAlone(t *testing.T) {
	dir := newRunDir(t)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644))
	called := false
	_, err := Keep(context.Background(), dir, func() error { called = true; return nil }, capSize)
	require.NoError(t, err)
	assert.True(t, called, "unmount is still called")
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	require.NoError(t, err)
	assert.Equal(t, "x", string(got))
	assert.NoDirExists(t, filepath.Join(filepath.Dir(dir), ".run-1.kept"))
}
