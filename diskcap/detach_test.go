package diskcap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallRoot mounts a filesystem of size bytes to stand in for a small runs
// root.
func smallRoot(t *testing.T, size int64) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	require.NoError(t, os.Mkdir(root, 0o755))
	unmount, err := Mount(context.Background(), root, size)
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("loop mounts unavailable here: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, unmount()) })
	return root
}

// fill writes to path until the filesystem is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			return
		}
	}
}

func TestAdmitNamesFreeAndNeeded(t *testing.T) {
	root := smallRoot(t, 32<<20)
	require.NoError(t, Admit(root, 1<<20))
	err := Admit(root, 64<<20)
	require.ErrorIs(t, err, ErrNoRoom)
	assert.Regexp(t, `runs root \S+ has [0-9.]+MiB free, this run needs 64MiB`, err.Error())
}

// TestMountedCapSurvivesAFullHost fills the runs root after a run's cap was
// mounted: the run can still write up to its cap, because the image was
// allocated at Mount. With a sparse image the loop device fails those
// writes (EIO) once the host is full.
func TestMountedCapSurvivesAFullHost(t *testing.T) {
	root := smallRoot(t, 64<<20)
	run := filepath.Join(root, "run")
	require.NoError(t, os.Mkdir(run, 0o755))
	unmount, err := Mount(context.Background(), run, capSize)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, unmount()) })

	fill(t, filepath.Join(root, "filler"))
	// A second run cannot be capped now: its image cannot be allocated.
	second := filepath.Join(root, "second")
	require.NoError(t, os.Mkdir(second, 0o755))
	unmountSecond, err := Mount(context.Background(), second, capSize)
	if err == nil {
		t.Cleanup(func() { _ = unmountSecond() })
	}
	require.ErrorIs(t, err, syscall.ENOSPC)
	assert.NoFileExists(t, imagePath(second))

	f, err := os.Create(filepath.Join(run, "data"))
	require.NoError(t, err)
	_, err = f.Write(make([]byte, capSize/2))
	require.NoError(t, err)
	require.NoError(t, f.Sync(), "a write within the cap is durable though the host is full")
	require.NoError(t, f.Close())
}

func TestDetachKeepsTheContentWithoutAMount(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "run")
	require.NoError(t, os.Mkdir(dir, 0o755))
	const size = 64 << 20
	_, err := Mount(context.Background(), dir, size)
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("loop mounts unavailable here: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = Release(dir) })
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kept"), []byte("the run's output"), 0o644))

	require.NoError(t, Detach(dir))
	mounted, err := Mounted(dir)
	require.NoError(t, err)
	assert.False(t, mounted, "a kept run holds no mount")
	assert.True(t, HasImage(dir))
	assert.Less(t, allocated(t, ImagePath(dir)), int64(size/2), "unused blocks went back to the host")

	release, err := Reattach(context.Background(), dir)
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(dir, "kept"))
	require.NoError(t, err)
	assert.Equal(t, "the run's output", string(data))
	assert.Error(t, os.WriteFile(filepath.Join(dir, "new"), nil, 0o644), "a reattached image is read-only")
	opts := mountOptionsOf(t, dir)
	for _, o := range []string{"ro", "nosuid", "nodev", "noexec"} {
		assert.Contains(t, opts, o, "a reattached image is mounted %s", o)
	}

	require.NoError(t, release())
	mounted, err = Mounted(dir)
	require.NoError(t, err)
	assert.False(t, mounted)
	assert.False(t, HasImage(dir))
}

// TestSecondMountOfADirLeavesTheFirstAlone: two runs racing for one run dir;
// the loser fails with ErrInUse and the winner's image and mount survive.
func TestSecondMountOfADirLeavesTheFirstAlone(t *testing.T) {
	dir := newRunDir(t)
	mountOrSkip(t, dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "winner"), []byte("w"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, "winner")))

	_, err := Mount(context.Background(), dir, capSize)
	require.ErrorIs(t, err, ErrInUse)
	assert.FileExists(t, imagePath(dir), "the winner's image was deleted")
	mounted, err := Mounted(dir)
	require.NoError(t, err)
	assert.True(t, mounted)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "still-works"), []byte("w"), 0o644))
}
