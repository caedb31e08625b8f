package diskcap

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mountOptionsOf returns the per-mount options of the mount on dir, as
// /proc/self/mountinfo lists them.
func mountOptionsOf(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	require.NoError(t, err)
	defer f.Close()
	var opts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 5 && fields[4] == dir {
			opts = strings.Split(fields[5], ",") // the last mount on dir wins
		}
	}
	require.NotNil(t, opts, "nothing is mounted on %s", dir)
	return opts
}

// fillStopsAtTheCap writes past capSize into dir and expects ENOSPC.
func fillStopsAtTheCap(t *testing.T, dir string) {
	t.Helper()
	out, err := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(dir, "fill"), "bs=1M", "count=64").CombinedOutput()
	require.Error(t, err, "dd must fail at the cap")
	assert.Contains(t, string(out), "No space left on device")
	require.NoError(t, os.Remove(filepath.Join(dir, "fill")))
}

func TestMountFromATemplateCapsTheDir(t *testing.T) {
	templates := filepath.Join(t.TempDir(), "diskcap")
	dir := newRunDir(t)
	unmount := mountOrSkip(t, dir, WithTemplates(templates))

	tmpl := templatePath(templates, capSize)
	fi, err := os.Stat(tmpl)
	require.NoError(t, err, "the first Mount makes the template")
	assert.Equal(t, int64(capSize), fi.Size())
	assert.Less(t, allocated(t, tmpl), int64(capSize/2), "the template is sparse: its metadata alone")
	dirInfo, err := os.Stat(templates)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), dirInfo.Mode().Perm(), "templates are the executor's alone")

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "an empty filesystem, without lost+found")
	fillStopsAtTheCap(t, dir)
	got := allocated(t, ImagePath(dir))
	assert.GreaterOrEqual(t, got, int64(capSize), "the run's image is fully allocated, like one formatted by mkfs")
	assert.LessOrEqual(t, got, int64(capSize+ImageOverhead))
	require.NoError(t, unmount())

	// The next Mount copies the same template.
	made := fi.ModTime()
	time.Sleep(10 * time.Millisecond)
	dir2 := newRunDir(t)
	unmount2, err := Mount(context.Background(), dir2, capSize, WithTemplates(templates))
	require.NoError(t, err)
	t.Cleanup(func() { _ = unmount2() })
	fi, err = os.Stat(tmpl)
	require.NoError(t, err)
	assert.Equal(t, made, fi.ModTime(), "the template is reused, not made again")
	fillStopsAtTheCap(t, dir2)
	require.NoError(t, os.WriteFile(filepath.Join(dir2, "kept"), []byte("data"), 0o644))
	require.NoError(t, unmount2())
	assert.False(t, HasImage(dir2), "unmount deletes the image")
}

// An image the kernel refuses (a corrupt template) is formatted again by
// mkfs.ext4, and the template is dropped so the next Mount makes it anew.
func TestMountFromACorruptTemplateFallsBackToMkfs(t *testing.T) {
	templates := filepath.Join(t.TempDir(), "diskcap")
	require.NoError(t, os.MkdirAll(templates, 0o700))
	garbage := bytes.Repeat([]byte("not ext4 "), 1<<16)
	require.NoError(t, os.WriteFile(templatePath(templates, capSize), garbage, 0o600))
	require.NoError(t, os.Truncate(templatePath(templates, capSize), capSize))

	dir := newRunDir(t)
	unmount := mountOrSkip(t, dir, WithTemplates(templates))
	fillStopsAtTheCap(t, dir)
	require.NoError(t, unmount())
	_, err := os.Stat(templatePath(templates, capSize))
	assert.ErrorIs(t, err, os.ErrNotExist, "the corrupt template is dropped")
}

// The host never honours a setuid bit or a device node the agent leaves in
// its run dir, however the filesystem was mounted.
func TestMountIsNosuidNodev(t *testing.T) {
	dir := newRunDir(t)
	mountOrSkip(t, dir)
	opts := mountOptionsOf(t, dir)
	assert.Contains(t, opts, "nosuid")
	assert.Contains(t, opts, "nodev")
	assert.Contains(t, opts, "rw")
}

// Where the kernel has no LOOP_CONFIGURE, mount(8) mounts the image with the
// same options.
func TestMountFallsBackToMountTool(t *testing.T) {
	dir := newRunDir(t)
	mountOrSkip(t, newRunDir(t)) // skips where loop mounts are unsupported
	img := filepath.Join(t.TempDir(), "fallback.img")
	require.NoError(t, makeImage(img, capSize))
	require.NoError(t, mkfs(context.Background(), img))
	old := func(string, string, mountOptions) error { return errNoLoopConfigure }
	out, err := mountVia(old, img, dir, mountOptions{flags: syscall.MS_NOSUID | syscall.MS_NODEV, data: "noinit_itable"})
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { _ = unmountBusy(dir); _ = awaitLoopDetached(img) })
	opts := mountOptionsOf(t, dir)
	assert.Contains(t, opts, "nosuid")
	assert.Contains(t, opts, "nodev")
}

// A maker that died leaves its temporary template; the next maker removes
// it once it is old enough not to be another maker's work in progress.
func TestTemplateRemovesStaleTemporaries(t *testing.T) {
	templates := filepath.Join(t.TempDir(), "diskcap")
	require.NoError(t, os.MkdirAll(templates, 0o700))
	stale := filepath.Join(templates, ".ext4-dead.tmp")
	fresh := filepath.Join(templates, ".ext4-busy.tmp")
	for _, p := range []string{stale, fresh} {
		require.NoError(t, os.WriteFile(p, nil, 0o600))
	}
	old := time.Now().Add(-2 * staleTempAge)
	require.NoError(t, os.Chtimes(stale, old, old))

	path, err := template(context.Background(), templates, capSize)
	if err != nil {
		if _, lookErr := exec.LookPath("mkfs.ext4"); lookErr != nil {
			t.Skipf("no mkfs.ext4 here: %v", lookErr)
		}
	}
	require.NoError(t, err)
	assert.FileExists(t, path)
	assert.NoFileExists(t, stale, "a dead maker's temporary is removed")
	assert.FileExists(t, fresh, "another maker's temporary in progress is left alone")
}

// A mount that fails for want of a loop device says nothing of the
// template: it is kept, and no second format is tried.
func TestMountKeepsTheTemplateWhenNoLoopDevice(t *testing.T) {
	templates := filepath.Join(t.TempDir(), "diskcap")
	mountOrSkip(t, newRunDir(t), WithTemplates(templates)) // makes the template
	real := mountImage
	t.Cleanup(func() { mountImage = real })
	calls := 0
	mountImage = func(string, string, mountOptions) ([]byte, error) {
		calls++
		return nil, syscall.ENXIO // as LOOP_CTL_GET_FREE without a free device
	}
	dir := newRunDir(t)
	_, err := Mount(context.Background(), dir, capSize, WithTemplates(templates))
	require.ErrorIs(t, err, ErrUnsupported, "the watchdog takes over")
	assert.Equal(t, 1, calls, "no second format and mount")
	assert.FileExists(t, templatePath(templates, capSize), "the template is kept")
	assert.False(t, HasImage(dir), "the failed image is deleted")
}
