package diskcap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// backingFiles is every loop device's backing file, as any container on
// the host can read it.
func backingFiles(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	require.NoError(t, err)
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil {
			out = append(out, strings.TrimSpace(string(b)))
		}
	}
	return out
}

// tenantRunDir is a run dir whose path names its tenant and run, as the
// executor's do.
func tenantRunDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "users", "victim-tenant", "conversations", "secret-project", "runs", "secret-run")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// A capped run dir's loop device is backed by an opaque image in the
// executor's images directory: no backing file path on the host names the
// tenant or the run, and the records that map the two are removed with
// the image.
func TestLoopBackingFileNamesNoRun(t *testing.T) {
	dir := tenantRunDir(t)
	templates := filepath.Join(t.TempDir(), "diskcap")
	unmount := mountOrSkip(t, dir, WithTemplates(templates))

	img := ImagePath(dir)
	assert.Equal(t, filepath.Join(templates, ImagesDirName), filepath.Dir(img))
	assert.Regexp(t, `^[0-9a-f]{32}\.img$`, filepath.Base(img))
	found := false
	for _, b := range backingFiles(t) {
		assert.NotContains(t, b, "victim-tenant")
		assert.NotContains(t, b, "secret-project")
		assert.NotContains(t, b, "secret-run")
		found = found || b == img
	}
	assert.True(t, found, "a loop device is backed by %s", img)
	owner, err := os.ReadFile(ownerPath(img))
	require.NoError(t, err)
	assert.Equal(t, dir, string(owner), "the image's record names its run dir for the host")

	require.NoError(t, unmount())
	assert.NoFileExists(t, img)
	assert.NoFileExists(t, ownerPath(img))
	assert.NoFileExists(t, refPath(dir))
}

// Detach, Reattach and Release find an opaque image through the run dir's
// record.
func TestDetachedOpaqueImageIsFoundAgain(t *testing.T) {
	dir := tenantRunDir(t)
	_, err := Mount(context.Background(), dir, capSize, WithImages(filepath.Join(t.TempDir(), "images")))
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("loop mounts unavailable here: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = Release(dir) })
	img := ImagePath(dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kept"), []byte("out"), 0o644))
	require.NoError(t, Detach(dir))
	assert.True(t, HasImage(dir))

	release, err := Reattach(context.Background(), dir)
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(dir, "kept"))
	require.NoError(t, err)
	assert.Equal(t, "out", string(data))
	require.NoError(t, release())
	assert.False(t, HasImage(dir))
	assert.NoFileExists(t, img)
	assert.NoFileExists(t, refPath(dir))
}

// SweepImages removes an image no run dir names, and leaves a live one.
func TestSweepImagesRemovesOnlyOrphans(t *testing.T) {
	dir := tenantRunDir(t)
	images := filepath.Join(t.TempDir(), "images")
	mountOrSkip(t, dir, WithImages(images))
	live := ImagePath(dir)

	orphan := filepath.Join(images, "0123456789abcdef0123456789abcdef.img")
	require.NoError(t, os.WriteFile(orphan, []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(ownerPath(orphan), []byte(filepath.Join(t.TempDir(), "gone")), 0o600))
	removed, err := SweepImages(images)
	require.NoError(t, err)
	assert.Equal(t, []string{orphan}, removed)
	assert.NoFileExists(t, orphan)
	assert.NoFileExists(t, ownerPath(orphan))
	assert.FileExists(t, live)
}
