package spool_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/spool"
)

// TestFullDiskKeepsWhatWasWritten fills a small tmpfs through a spool: the
// spool reports ENOSPC as such, every byte it accepted stays readable, and
// what it refused is counted.
func TestFullDiskKeepsWhatWasWritten(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "taskrun-spool-test", dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { assert.NoError(t, exec.Command("umount", dir).Run()) })

	s, err := spool.New(filepath.Join(dir, "stdout.log"))
	require.NoError(t, err)
	defer s.Close()
	var sent bytes.Buffer
	var werr error
	for i := 0; werr == nil; i++ {
		line := fmt.Appendf(nil, "line %06d %s\n", i, bytes.Repeat([]byte{'x'}, 1000))
		sent.Write(line)
		_, werr = s.Write(line)
	}
	require.ErrorIs(t, werr, spool.ErrNoSpace)
	require.ErrorIs(t, werr, syscall.ENOSPC)
	assert.Contains(t, werr.Error(), "bytes were kept")
	require.ErrorIs(t, s.Err(), syscall.ENOSPC)
	_, err = s.Write([]byte("after"))
	require.ErrorIs(t, err, syscall.ENOSPC)

	kept := s.Size()
	require.Positive(t, kept)
	assert.Equal(t, int64(sent.Len())-kept+int64(len("after")), s.Lost(), "every refused byte is counted")
	require.NoError(t, s.Close())
	rd := s.NewReader(0)
	defer rd.Close()
	got, err := io.ReadAll(rd)
	require.NoError(t, err)
	assert.Equal(t, sent.Bytes()[:kept], got, "what the spool accepted is intact")
}
