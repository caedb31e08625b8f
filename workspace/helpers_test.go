package workspace_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// hangTimeout bounds every call that hostile input could make block.
// bulkTimeout bounds calls on the 10k-file trees, which can take many seconds
// on a loaded machine.
const (
	hangTimeout = 10 * time.Second
	bulkTimeout = 2 * time.Minute
)

// noHang runs fn in a goroutine and fails the test if it does not return
// within hangTimeout, so a hang shows up as a failure instead of a stuck test.
func noHang(t *testing.T, what string, fn func()) {
	t.Helper()
	returnsWithin(t, hangTimeout, what, fn)
}

// returnsWithin is noHang with an explicit bound.
func returnsWithin(t *testing.T, limit time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("%s did not return within %s (hang)", what, limit)
	}
}

// writeFile creates path (and its parents) with content and mode.
func writeFile(t *testing.T, path, content string, mode fs.FileMode) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), mode))
	require.NoError(t, os.Chmod(path, mode))
}

// canaryContent marks data that lives outside every root under test.
const canaryContent = "CANARY-outside-the-root-must-never-be-read"

// makeCanary creates a directory outside any root holding a canary file and
// returns the file's path.
func makeCanary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	writeFile(t, p, canaryContent, 0o644)
	return p
}

// tarEntry is one entry of a test archive.
type tarEntry struct {
	hdr  tar.Header
	body string
}

func regEntry(name, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}, body: body}
}

func dirEntry(name string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}

func linkEntry(typ byte, name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: typ, Name: name, Linkname: target, Mode: 0o777}}
}

// buildArchive returns a gzip-compressed tar of entries.
func buildArchive(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		hdr := e.hdr
		require.NoError(t, tw.WriteHeader(&hdr))
		_, err := tw.Write([]byte(e.body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	return buf.Bytes()
}

// treeEntry describes one entry of a directory tree for comparisons.
type treeEntry struct {
	Type    string
	Perm    fs.FileMode
	Content string
	Target  string
	MTime   int64
}

// snapshot walks dir without following symlinks. Directory mtimes are left
// out because they are also covered by the dedicated mtime checks.
func snapshot(t *testing.T, dir string) map[string]treeEntry {
	t.Helper()
	out := map[string]treeEntry{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		e := treeEntry{Type: info.Mode().Type().String(), Perm: info.Mode().Perm()}
		switch {
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			e.Content = string(b)
			e.MTime = info.ModTime().Unix()
		case info.Mode()&fs.ModeSymlink != 0:
			e.Perm = 0
			e.Target, err = os.Readlink(p)
			if err != nil {
				return err
			}
		}
		out[filepath.ToSlash(rel)] = e
		return nil
	})
	require.NoError(t, err)
	return out
}

// requireDirEmptyOrMissing asserts that nothing was restored at dir.
func requireDirEmptyOrMissing(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return
	}
	require.NoError(t, err)
	require.Empty(t, entries, "dir %s must be empty", dir)
}

// requireNoStaging asserts that no staging directory was left next to dest.
func requireNoStaging(t *testing.T, dest string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(dest))
	require.NoError(t, err)
	for _, e := range entries {
		require.False(t, strings.Contains(e.Name(), ".unpack-"), "staging dir %s left behind", e.Name())
	}
}

// ownerOf returns a file's numeric uid and gid without following symlinks.
func ownerOf(t *testing.T, path string) (uid, gid uint32) {
	t.Helper()
	info, err := os.Lstat(path)
	require.NoError(t, err)
	st, ok := info.Sys().(*syscall.Stat_t)
	require.True(t, ok)
	return st.Uid, st.Gid
}

// skipReasons maps skipped paths to their reasons.
func skipReasons(skips []workspace.Skip) map[string]string {
	out := map[string]string{}
	for _, s := range skips {
		out[s.Path] = s.Reason
	}
	return out
}
