package workspace

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests replace an entry between the walker's Lstat and its open, the
// window a hostile writer races for, deterministically.

// lstatNode returns the node the walker would build for name under dir.
func lstatNode(t *testing.T, dir *os.Root, name string) node {
	t.Helper()
	info, err := dir.Lstat(name)
	require.NoError(t, err)
	return node{rel: name, name: name, parent: newDirRef(dir), info: info}
}

// replace atomically puts what create makes at a temporary name in place of p.
func replace(t *testing.T, p string, create func(tmp string) error) {
	t.Helper()
	tmp := p + ".new"
	require.NoError(t, create(tmp))
	require.NoError(t, os.Rename(tmp, p))
}

func TestOpenRegularRefusesSwappedEntries(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(outside, []byte("outside"), 0o644))

	tests := []struct {
		name   string
		swapTo func(t *testing.T, p string)
		reason string
	}{
		{"fifo", func(t *testing.T, p string) {
			replace(t, p, func(tmp string) error { return syscall.Mkfifo(tmp, 0o644) })
		}, reasonNotRegular},
		{"symlink outside", func(t *testing.T, p string) {
			replace(t, p, func(tmp string) error { return os.Symlink(outside, tmp) })
		}, "cannot open"},
		{"symlink inside", func(t *testing.T, p string) {
			replace(t, p, func(tmp string) error { return os.Symlink("other", tmp) })
		}, reasonReplaced},
		{"other file", func(t *testing.T, p string) {
			replace(t, p, func(tmp string) error { return os.WriteFile(tmp, []byte("new"), 0o644) })
		}, reasonReplaced},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "f")
			require.NoError(t, os.WriteFile(p, []byte("original"), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "other"), []byte("other"), 0o644))
			root, err := os.OpenRoot(dir)
			require.NoError(t, err)
			defer root.Close()
			n := lstatNode(t, root, "f")
			tt.swapTo(t, p)

			done := make(chan string, 1)
			go func() {
				f, _, reason := openRegular(n)
				if f != nil {
					f.Close()
				}
				done <- reason
			}()
			select {
			case reason := <-done:
				assert.Contains(t, reason, tt.reason)
			case <-time.After(10 * time.Second):
				t.Fatal("openRegular blocked on a swapped entry")
			}
		})
	}
}

// recorder is a visitor that records skips and walked directories.
type recorder struct {
	skips   map[string]string
	entered []string
}

func (r *recorder) exclude(string) bool        { return false }
func (r *recorder) file(node) error            { return nil }
func (r *recorder) symlink(node, string) error { return nil }
func (r *recorder) skip(rel, reason string)    { r.skips[rel] = reason }
func (r *recorder) enterDir(n node, _ *dirRef) (func() error, error) {
	r.entered = append(r.entered, n.rel)
	return func() error { return nil }, nil
}

func TestVisitDirRefusesSwappedDirectory(t *testing.T) {
	outside := t.TempDir()
	tests := []struct {
		name   string
		target func(dir string) string
		reason string
	}{
		{"symlink outside", func(string) string { return outside }, "cannot open directory"},
		{"symlink inside", func(string) string { return "other" }, reasonReplaced},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.Mkdir(filepath.Join(dir, "d"), 0o755))
			require.NoError(t, os.Mkdir(filepath.Join(dir, "other"), 0o755))
			root, err := os.OpenRoot(dir)
			require.NoError(t, err)
			defer root.Close()
			n := lstatNode(t, root, "d")
			require.NoError(t, os.Remove(filepath.Join(dir, "d")))
			require.NoError(t, os.Symlink(tt.target(dir), filepath.Join(dir, "d")))

			rec := &recorder{skips: map[string]string{}}
			w := &walker{dev: deviceOf(n.info), v: rec}
			require.NoError(t, w.visitDir(t.Context(), n, 1))
			assert.Contains(t, rec.skips["d"], tt.reason)
			assert.Empty(t, rec.entered)
		})
	}
}
