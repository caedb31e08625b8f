package workspace_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// benchOwner chowns like cp -a does when running as root.
func benchOwner() *workspace.Owner {
	if os.Geteuid() == 0 {
		return &workspace.SandboxOwner
	}
	return nil
}

// BenchmarkCopyTree copies a 10k-small-file tree with CopyTree and, in the
// same iteration, with `cp -a`, and reports CopyTree's time as a multiple of
// cp's ("x-cp-a"; the target is <= 1.2).
func BenchmarkCopyTree(b *testing.B) {
	cp, err := exec.LookPath("cp")
	if err != nil {
		b.Skip("cp not found: ", err)
	}
	src := b.TempDir()
	makeTree(b, src, 10_000)
	scratch := b.TempDir()
	var ours, theirs time.Duration
	for b.Loop() {
		b.StopTimer()
		dstOurs, dstCp := filepath.Join(scratch, "ours"), filepath.Join(scratch, "cp")
		require.NoError(b, os.Mkdir(dstOurs, 0o755))
		require.NoError(b, os.Mkdir(dstCp, 0o755))
		b.StartTimer()

		start := time.Now()
		_, err := workspace.CopyTree(context.Background(), src, dstOurs, workspace.CopyOptions{Owner: benchOwner()})
		ours += time.Since(start)
		require.NoError(b, err)

		b.StopTimer()
		start = time.Now()
		out, err := exec.Command(cp, "-a", src+"/.", dstCp).CombinedOutput()
		theirs += time.Since(start)
		require.NoError(b, err, "%s", out)
		require.NoError(b, os.RemoveAll(dstOurs))
		require.NoError(b, os.RemoveAll(dstCp))
		b.StartTimer()
	}
	b.ReportMetric(float64(ours)/float64(theirs), "x-cp-a")
	b.ReportMetric(float64(theirs.Nanoseconds())/float64(b.N), "cp-ns/op")
}

// BenchmarkPackUnpack packs a 10k-file home into memory and restores it.
func BenchmarkPackUnpack(b *testing.B) {
	home := b.TempDir()
	makeTree(b, home, 10_000)
	scratch := b.TempDir()
	var buf bytes.Buffer
	for b.Loop() {
		buf.Reset()
		stats, err := workspace.PackHome(context.Background(), home, &buf, workspace.PackOptions{Exclude: workspace.DefaultExcludes})
		require.NoError(b, err)
		b.SetBytes(stats.Bytes)
		dest := filepath.Join(scratch, "home")
		_, err = workspace.UnpackHome(context.Background(), &buf, dest, workspace.UnpackOptions{Owner: benchOwner()})
		require.NoError(b, err)

		b.StopTimer()
		require.NoError(b, os.RemoveAll(dest))
		b.StartTimer()
	}
}
