package workspace_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// sparseFile creates a file of size bytes with nothing allocated, as an
// agent's `truncate -s` would.
func sparseFile(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	require.NoError(t, f.Close())
}

// countingVisit reads every collected file to its end and counts the bytes
// the host read.
func countingVisit(read *int64, names *[]string) func(context.Context, workspace.CollectedFile) error {
	return func(_ context.Context, f workspace.CollectedFile) error {
		n, err := io.Copy(io.Discard, f.Reader)
		*read += n
		*names = append(*names, f.RelPath)
		return err
	}
}

// Sparse files (GiBs long, nothing allocated) are skipped with a reason,
// never read; a written file beside them is collected.
//
// Without the allocated-size check, Collect reads 3 GiB of holes.
func TestCollectSkipsSparseFiles(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "report.md"), "# result", 0o644)
	for _, name := range []string{"huge.bin", "also-huge.bin", "sub/third.bin"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755))
		sparseFile(t, filepath.Join(root, name), 1<<30)
	}
	// Small holes stay within the allowance: such a file is kept.
	sparseFile(t, filepath.Join(root, "small-hole.bin"), workspace.SparseAllowance)

	var read int64
	var names []string
	rep, err := workspace.Collect(context.Background(), root, workspace.CollectOptions{MaxFileBytes: 2 << 30, MaxTotalBytes: 8 << 30}, countingVisit(&read, &names))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"report.md", "small-hole.bin"}, names)
	assert.Equal(t, int64(len("# result"))+workspace.SparseAllowance, read)
	reasons := skipReasons(rep.Skipped)
	for _, name := range []string{"huge.bin", "also-huge.bin", "sub/third.bin"} {
		assert.Contains(t, reasons[name], "sparse file: 1073741824 bytes long", name)
	}
}

// A file hard-linked many times, within one root and across the roots of a
// run (artifacts, output, home), is read once; every other link is skipped
// with a reason naming the first.
//
// Without the (dev, ino) ledger, each link is read again.
func TestCollectReadsAHardLinkedFileOnce(t *testing.T) {
	run := t.TempDir()
	artifacts, output, home := filepath.Join(run, "artifacts"), filepath.Join(run, "output"), filepath.Join(run, "home")
	for _, d := range []string{artifacts, output, home} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	body := strings.Repeat("x", 1<<20)
	writeFile(t, filepath.Join(artifacts, "a0"), body, 0o644)
	for i := 1; i < 20; i++ {
		require.NoError(t, os.Link(filepath.Join(artifacts, "a0"), filepath.Join(artifacts, "a"+string(rune('a'+i)))))
	}
	require.NoError(t, os.Link(filepath.Join(artifacts, "a0"), filepath.Join(output, "result.md")))
	require.NoError(t, os.Link(filepath.Join(artifacts, "a0"), filepath.Join(home, "copy")))
	writeFile(t, filepath.Join(home, "own"), "mine", 0o644)

	ledger := workspace.NewLedger(1 << 30)
	var read int64
	var names []string
	rep, err := workspace.Collect(context.Background(), artifacts, workspace.CollectOptions{Ledger: ledger}, countingVisit(&read, &names))
	require.NoError(t, err)
	assert.Equal(t, []string{"a0"}, names)
	assert.Len(t, rep.Skipped, 19)
	for _, s := range rep.Skipped {
		assert.Equal(t, `hard link to a file already read as "a0"`, s.Reason, s.Path)
	}
	rep, err = workspace.Collect(context.Background(), output, workspace.CollectOptions{Ledger: ledger}, countingVisit(&read, &names))
	require.NoError(t, err)
	assert.Equal(t, `hard link to a file already read as "a0"`, skipReasons(rep.Skipped)["result.md"])
	var archive bytes.Buffer
	stats, err := workspace.PackHome(context.Background(), home, &archive, workspace.PackOptions{Ledger: ledger})
	require.NoError(t, err)
	assert.Equal(t, `hard link to a file already read as "a0"`, skipReasons(stats.Skipped)["copy"])
	assert.EqualValues(t, 1, stats.Files, "the home's own file is archived")
	assert.EqualValues(t, len(body), read)
	assert.EqualValues(t, len(body)+len("mine"), ledger.Read())
}

// The ledger's total caps what all of a run's collections read together;
// a file past it is skipped with a reason.
//
// Without the shared total, each Collect call gets a fresh per-call cap.
func TestCollectLedgerCapsTheRunTotal(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(a, "one"), strings.Repeat("1", 600), 0o644)
	writeFile(t, filepath.Join(b, "two"), strings.Repeat("2", 600), 0o644)
	writeFile(t, filepath.Join(b, "three"), strings.Repeat("3", 300), 0o644)
	ledger := workspace.NewLedger(1000)
	var read int64
	var names []string
	_, err := workspace.Collect(context.Background(), a, workspace.CollectOptions{Ledger: ledger}, countingVisit(&read, &names))
	require.NoError(t, err)
	rep, err := workspace.Collect(context.Background(), b, workspace.CollectOptions{Ledger: ledger}, countingVisit(&read, &names))
	require.NoError(t, err)
	assert.Equal(t, []string{"one", "three"}, names)
	assert.EqualValues(t, 900, read)
	assert.Equal(t, "file of 600 bytes would exceed the run's collection total of 1000 bytes", skipReasons(rep.Skipped)["two"])
}

// PackHome leaves sparse files out of the session state too.
//
// Without the check, the archive streams 2 GiB of zeros through gzip.
func TestPackHomeSkipsSparseFiles(t *testing.T) {
	home := t.TempDir()
	writeFile(t, filepath.Join(home, "main.go"), "package main", 0o644)
	sparseFile(t, filepath.Join(home, "disk.img"), 2<<30)
	stats, err := workspace.PackHome(context.Background(), home, io.Discard, workspace.PackOptions{MaxBytes: 4 << 30})
	require.NoError(t, err)
	assert.EqualValues(t, 1, stats.Files)
	assert.EqualValues(t, len("package main"), stats.Bytes)
	assert.Contains(t, skipReasons(stats.Skipped)["disk.img"], "sparse file")
}
