package workspace_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// collectAll runs Collect (bounded by hangTimeout) and returns the content of
// every collected file by path.
func collectAll(t *testing.T, root string, opts workspace.CollectOptions) (map[string]string, workspace.CollectReport, error) {
	t.Helper()
	got := map[string]string{}
	var (
		report workspace.CollectReport
		err    error
	)
	noHang(t, "Collect", func() {
		report, err = workspace.Collect(context.Background(), root, opts, func(_ context.Context, f workspace.CollectedFile) error {
			b, err := io.ReadAll(f.Reader)
			if err != nil {
				return err
			}
			if int64(len(b)) != f.Size || !f.Mode.IsRegular() {
				return errors.New("collected file does not match its description")
			}
			got[f.RelPath] = string(b)
			return nil
		})
	})
	return got, report, err
}

func TestCollectSkipsHostileEntries(t *testing.T) {
	root := t.TempDir()
	canary := makeCanary(t)
	writeFile(t, filepath.Join(root, "report.md"), "# result", 0o644)
	writeFile(t, filepath.Join(root, "nested", "data.csv"), "a,b\n1,2\n", 0o600)
	require.NoError(t, os.Symlink("/etc/shadow", filepath.Join(root, "shadow")))
	require.NoError(t, os.Symlink(canary, filepath.Join(root, "out")))
	require.NoError(t, os.Symlink("/", filepath.Join(root, "rootfs")))
	require.NoError(t, os.Symlink(filepath.Dir(canary), filepath.Join(root, "nested", "tenant")))
	require.NoError(t, os.Symlink("report.md", filepath.Join(root, "inside-link")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(root, "nested", "fifo"), 0o666))
	l, err := net.Listen("unix", filepath.Join(root, "sock"))
	require.NoError(t, err)
	defer l.Close()
	haveDevice := os.Geteuid() == 0 && syscall.Mknod(filepath.Join(root, "null"), syscall.S_IFCHR|0o666, 1<<8|3) == nil

	got, report, err := collectAll(t, root, workspace.CollectOptions{})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"report.md": "# result", "nested/data.csv": "a,b\n1,2\n"}, got)
	assert.Equal(t, int64(2), report.Files)
	assert.Equal(t, int64(len("# result")+len("a,b\n1,2\n")), report.Bytes)

	reasons := skipReasons(report.Skipped)
	for _, p := range []string{"shadow", "out", "rootfs", "nested/tenant", "inside-link"} {
		assert.Contains(t, reasons[p], "not followed", p)
	}
	assert.Contains(t, reasons["nested/fifo"], "FIFO")
	assert.Contains(t, reasons["sock"], "socket")
	if haveDevice {
		assert.Contains(t, reasons["null"], "character device")
	}
}

func TestCollectCaps(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "a"), "1234", 0o644)
	writeFile(t, filepath.Join(root, "b"), "123456789", 0o644)
	writeFile(t, filepath.Join(root, "c"), "1234", 0o644)
	writeFile(t, filepath.Join(root, "d"), "1", 0o644)
	writeFile(t, filepath.Join(root, "e"), "1", 0o644)

	got, report, err := collectAll(t, root, workspace.CollectOptions{MaxFileBytes: 8, MaxTotalBytes: 7, MaxFiles: 2})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"a": "1234", "d": "1"}, got)
	reasons := skipReasons(report.Skipped)
	assert.Contains(t, reasons["b"], "per-file cap")
	assert.Contains(t, reasons["c"], "total cap")
	assert.Contains(t, reasons["e"], "file count cap")
}

func TestCollectStopsOnVisitError(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "a"), "x", 0o644)
	writeFile(t, filepath.Join(root, "b"), "y", 0o644)
	boom := errors.New("upload failed")
	calls := 0
	_, err := workspace.Collect(context.Background(), root, workspace.CollectOptions{}, func(context.Context, workspace.CollectedFile) error {
		calls++
		return boom
	})
	require.ErrorIs(t, err, boom)
	assert.Equal(t, 1, calls)
}

func TestCollectRefusesSymlinkedRoot(t *testing.T) {
	link := filepath.Join(t.TempDir(), "artifacts")
	require.NoError(t, os.Symlink(filepath.Dir(makeCanary(t)), link))
	_, _, err := collectAll(t, link, workspace.CollectOptions{})
	require.Error(t, err)
}

// swapper keeps replacing entries under root with hostile ones until stopped:
// a directory with a symlink to a directory outside, a regular file with a
// FIFO, and a regular file with a symlink to the canary.
type swapper struct {
	root, outsideDir, canary string
	stop                     chan struct{}
	wg                       sync.WaitGroup
}

func (s *swapper) start(t *testing.T) {
	t.Helper()
	writeFile(t, filepath.Join(s.root, "dir", "secret.txt"), "inside", 0o644)
	s.stop = make(chan struct{})
	for _, loop := range []func(){s.swapDir, s.swapFIFO, s.swapLeaf} {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				select {
				case <-s.stop:
					return
				default:
					loop()
				}
			}
		}()
	}
}

func (s *swapper) halt() {
	close(s.stop)
	s.wg.Wait()
}

func (s *swapper) swapDir() {
	dir, aside := filepath.Join(s.root, "dir"), filepath.Join(s.root, "dir.aside")
	_ = os.Rename(dir, aside)
	_ = os.Symlink(s.outsideDir, dir)
	_ = os.Remove(dir)
	_ = os.Rename(aside, dir)
}

func (s *swapper) swapFIFO() {
	p := filepath.Join(s.root, "pipe")
	_ = os.WriteFile(p, []byte("regular for now"), 0o644)
	_ = os.Remove(p)
	_ = syscall.Mkfifo(p, 0o644)
	_ = os.Remove(p)
}

func (s *swapper) swapLeaf() {
	p := filepath.Join(s.root, "leaf")
	_ = os.WriteFile(p, []byte("leaf"), 0o644)
	_ = os.Remove(p)
	_ = os.Symlink(s.canary, p)
	_ = os.Remove(p)
}

func TestCollectUnderSwapRace(t *testing.T) {
	root := t.TempDir()
	canary := makeCanary(t)
	outsideDir := filepath.Dir(canary)
	require.NoError(t, os.WriteFile(filepath.Join(outsideDir, "secret.txt"), []byte(canaryContent), 0o644))
	s := &swapper{root: root, outsideDir: outsideDir, canary: canary}
	s.start(t)
	defer s.halt()

	deadline := time.Now().Add(2 * time.Second)
	runs := 0
	for ; runs < 50 || time.Now().Before(deadline); runs++ {
		got, _, err := collectAll(t, root, workspace.CollectOptions{})
		require.NoError(t, err)
		for p, content := range got {
			require.False(t, bytes.Contains([]byte(content), []byte(canaryContent)), "run %d collected outside content at %s", runs, p)
		}
		if c, ok := got["dir/secret.txt"]; ok {
			require.Equal(t, "inside", c)
		}
	}
	t.Logf("%d collections under swapping", runs)
}

func TestCollectDoesNotCrossMountPoints(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "kept.txt"), "same filesystem", 0o644)
	mnt := filepath.Join(root, "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mounting a tmpfs needs CAP_SYS_ADMIN: %v", err)
	}
	t.Cleanup(func() { require.NoError(t, syscall.Unmount(mnt, 0)) })
	writeFile(t, filepath.Join(mnt, "other-fs.txt"), "another filesystem", 0o644)

	got, report, err := collectAll(t, root, workspace.CollectOptions{})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"kept.txt": "same filesystem"}, got)
	assert.Contains(t, skipReasons(report.Skipped)["mnt"], "another filesystem")
}

func TestCollectReportsFilesThatGrowInsteadOfTruncating(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "a-growing"), "short", 0o644)
	writeFile(t, filepath.Join(root, "b-stable"), "stable", 0o644)
	got := map[string]string{}
	report, err := workspace.Collect(context.Background(), root, workspace.CollectOptions{}, func(_ context.Context, f workspace.CollectedFile) error {
		if f.RelPath == "a-growing" {
			fh, err := os.OpenFile(filepath.Join(root, f.RelPath), os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = fh.WriteString(" and then much longer")
			require.NoError(t, err)
			require.NoError(t, fh.Close())
		}
		b, err := io.ReadAll(f.Reader)
		if err != nil {
			return err
		}
		got[f.RelPath] = string(b)
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"b-stable": "stable"}, got)
	assert.Contains(t, skipReasons(report.Skipped)["a-growing"], "changed")
}
