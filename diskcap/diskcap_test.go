package diskcap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const capSize = 16 << 20

func mountOrSkip(t *testing.T, dir string, opts ...Option) func() error {
	t.Helper()
	unmount, err := Mount(context.Background(), dir, capSize, opts...)
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("loop mounts unavailable here, Watch is the mechanism: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, unmount()) })
	return unmount
}

func newRunDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run-1")
	require.NoError(t, os.Mkdir(dir, 0o777))
	require.NoError(t, os.Chmod(dir, 0o777))
	return dir
}

func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	return st.Blocks * 512
}

func TestMountStopsDdAtTheCap(t *testing.T) {
	dir := newRunDir(t)
	unmount := mountOrSkip(t, dir)
	img := filepath.Join(filepath.Dir(dir), ".run-1.diskcap.img")

	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o777), fi.Mode().Perm(), "the mounted root keeps the run dir's mode")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "no lost+found in the run dir")

	out, err := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(dir, "fill"), "bs=1M", "count=64").CombinedOutput()
	require.Error(t, err, "dd must not write 64 MiB into a 16 MiB cap")
	assert.Contains(t, string(out), "No space left on device")

	used, err := Usage(dir)
	require.NoError(t, err)
	assert.LessOrEqual(t, used, int64(capSize))
	assert.Greater(t, used, int64(capSize/2), "dd filled the cap")
	assert.LessOrEqual(t, allocated(t, img), int64(capSize+ImageOverhead), "the host loses at most the cap")

	require.NoError(t, unmount())
	_, err = os.Stat(img)
	assert.ErrorIs(t, err, os.ErrNotExist, "Unmount deletes the image")
	entries, err = os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

func TestMountStopsAContainerAtTheCap(t *testing.T) {
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("docker CLI not installed")
	}
	dir := newRunDir(t)
	unmount := mountOrSkip(t, dir)
	defer func() { require.NoError(t, unmount()) }()
	label := fmt.Sprintf("dev.taskrun.test.diskcap=%d-%d", os.Getpid(), time.Now().UnixNano())
	cmd := exec.Command("docker", "run", "--rm", "--label", "dev.taskrun.managed=true", "--label", label,
		"--network", "none", "--user", "10001:10001", "--read-only", "--cap-drop", "ALL",
		"-v", dir+":/taskrun", "taskrun/testbox:local",
		"dd", "if=/dev/zero", "of=/taskrun/fill", "bs=1M", "count=64")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	require.Error(t, err, "the container's dd must fail")
	assert.Contains(t, stderr.String(), "No space left on device")
	assert.LessOrEqual(t, allocated(t, filepath.Join(filepath.Dir(dir), ".run-1.diskcap.img")), int64(capSize+ImageOverhead))
}

func TestMountRefusesBadInput(t *testing.T) {
	dir := newRunDir(t)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x"), []byte("x"), 0o644))
	_, err := Mount(context.Background(), dir, capSize)
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	assert.ErrorIs(t, err, ErrNotEmpty)
	_, err = Mount(context.Background(), dir, 1<<20)
	assert.Error(t, err, "below MinSize")
}

func TestWatchFiresWhenOverTheCap(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	writerDone := make(chan int64)
	go func() {
		var written int64
		chunk := bytes.Repeat([]byte{1}, 256<<10)
		for i := 0; ctx.Err() == nil; i++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), chunk, 0o644); err != nil {
				break
			}
			written += int64(len(chunk))
			time.Sleep(time.Millisecond)
		}
		writerDone <- written
	}()

	const limit = 4 << 20
	var fired int64 = -1
	err := Watch(ctx, dir, limit, 10*time.Millisecond, func(used int64) {
		fired = used
		cancel() // stop the "run"
	})
	require.NoError(t, err)
	written := <-writerDone
	assert.Greater(t, fired, int64(limit), "callback gets the measured usage")
	assert.GreaterOrEqual(t, written, int64(limit), "the writer really wrote past the cap")
}

func TestWatchReturnsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	err := Watch(ctx, t.TempDir(), 1<<30, time.Hour, func(int64) { called = true })
	assert.ErrorIs(t, err, context.Canceled)
	assert.False(t, called)
}

func TestUsageCountsHardLinksOnce(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "a")
	require.NoError(t, os.WriteFile(f, bytes.Repeat([]byte{1}, 1<<20), 0o644))
	one, err := Usage(dir)
	require.NoError(t, err)
	require.NoError(t, os.Link(f, filepath.Join(dir, "b")))
	two, err := Usage(dir)
	require.NoError(t, err)
	assert.Equal(t, one, two)
	assert.GreaterOrEqual(t, one, int64(1<<20))
}

// Release unmounts a cap left by a process that is gone, deletes its image,
// and is a no-op the second time.
func TestReleaseUndoesAMountFromElsewhere(t *testing.T) {
	dir := newRunDir(t)
	// The unmount func is dropped, as by an executor that exited.
	_, err := Mount(context.Background(), dir, capSize)
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("loop mounts unavailable here: %v", err)
	}
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644))

	require.NoError(t, Release(dir))
	mounted, err := isMountPoint(dir)
	require.NoError(t, err)
	assert.False(t, mounted)
	assert.NoFileExists(t, imagePath(dir))
	assert.NoFileExists(t, filepath.Join(dir, "f"), "the mounted contents went with the mount")
	require.NoError(t, Release(dir), "releasing twice is harmless")
}

// A tree the watchdog cannot measure (say, a directory the run made
// unreadable) counts as over the cap: the watchdog fails closed.
func TestWatchFailsClosedWhenUnmeasurable(t *testing.T) {
	defer func(f func(string) (int64, error)) { measure = f }(measure)
	measure = func(string) (int64, error) { return 0, fs.ErrPermission }

	fired := false
	err := Watch(context.Background(), t.TempDir(), 1<<30, time.Millisecond, func(int64) { fired = true })
	require.ErrorIs(t, err, ErrUnmeasurable)
	assert.True(t, fired, "over is called for an unmeasurable tree")
}

// A mount that fails after the kernel mounted (mount(8) killed, say) must
// not leave the loop mount behind with its image deleted.
func TestMountThatFailsAfterTheKernelMountedLeavesNothing(t *testing.T) {
	dir := newRunDir(t)
	mountOrSkip(t, newRunDir(t)) // skips where loop mounts are unsupported
	real := mountImage
	t.Cleanup(func() { mountImage = real })
	mountImage = func(img, dir string, o mountOptions) ([]byte, error) {
		out, err := real(img, dir, o)
		require.NoError(t, err, "%s", out)
		return []byte("mount: killed"), errors.New("signal: killed")
	}
	t.Cleanup(func() {
		if m, _ := Mounted(dir); m {
			_ = exec.Command("umount", dir).Run()
		}
		_ = os.Remove(ImagePath(dir))
	})

	_, err := Mount(context.Background(), dir, capSize)
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrUnsupported, "the host mounted: loop mounts are supported, the watchdog must not take over")
	mounted, err := Mounted(dir)
	require.NoError(t, err)
	assert.False(t, mounted, "the mount is undone")
	assert.False(t, HasImage(dir), "the image is deleted once nothing is mounted")
	out, _ := exec.Command("losetup", "-j", ImagePath(dir)).Output()
	assert.Empty(t, bytes.TrimSpace(out), "no loop device backs the image")
}

func TestMountRefusesADirThatIsAlreadyAMountPoint(t *testing.T) {
	dir := newRunDir(t)
	mountOrSkip(t, dir)
	require.NoError(t, os.Rename(ImagePath(dir), ImagePath(dir)+".moved"))
	t.Cleanup(func() { _ = os.Rename(ImagePath(dir)+".moved", ImagePath(dir)) })

	_, err := Mount(context.Background(), dir, capSize)
	require.ErrorIs(t, err, ErrInUse, "a second cap on a mounted dir would stack mounts")
	assert.False(t, HasImage(dir), "no second image is made")
}

// A run dir that stays busy (here: a descriptor open inside it, as a copy of
// the mount in another namespace would hold it) is still gone from the
// host's mounts once unmount returns: it is detached lazily.
func TestUnmountDetachesADirThatStaysBusy(t *testing.T) {
	dir := newRunDir(t)
	unmount := mountOrSkip(t, dir)
	held, err := os.Create(filepath.Join(dir, "held"))
	require.NoError(t, err)
	defer held.Close()
	retries := busyRetries
	busyRetries = 2
	t.Cleanup(func() { busyRetries = retries })

	require.NoError(t, unmount())
	mounted, err := isMountPoint(dir)
	require.NoError(t, err)
	assert.False(t, mounted, "the busy run dir is no longer a mount point on the host")
	_, err = held.WriteString("still writable through the detached mount")
	assert.NoError(t, err, "what held it keeps its view until it lets go")
}
