package spool_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/spool"
)

func TestFollowFileTailsUntilRemoved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stdout.log")
	s, err := spool.New(path)
	require.NoError(t, err)
	_, err = s.Write([]byte("first\n"))
	require.NoError(t, err)

	var out lockedbuf.Buffer
	res := make(chan error, 1)
	go func() {
		_, err := spool.FollowFile(context.Background(), path, &out, 10*time.Millisecond, nil)
		res <- err
	}()
	require.Eventually(t, func() bool { return out.String() == "first\n" }, testdeadline.Scale(10*time.Second), 5*time.Millisecond)
	_, err = s.Write([]byte("second\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return out.String() == "first\nsecond\n" }, testdeadline.Scale(10*time.Second), 5*time.Millisecond)
	_, err = s.Write([]byte("last\n"))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, os.Remove(path))
	require.NoError(t, <-res)
	assert.Equal(t, "first\nsecond\nlast\n", out.String())
}

func TestFollowFileStopsWhenDone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stdout.log")
	require.NoError(t, os.WriteFile(path, []byte("all\n"), 0o600))
	var out lockedbuf.Buffer
	polls := 0
	n, err := spool.FollowFile(context.Background(), path, &out, 10*time.Millisecond, func() bool { polls++; return polls == 3 })
	require.NoError(t, err)
	assert.Equal(t, int64(4), n)
	assert.Equal(t, "all\n", out.String())
}

func TestFollowFileMissing(t *testing.T) {
	_, err := spool.FollowFile(context.Background(), filepath.Join(t.TempDir(), "none"), &lockedbuf.Buffer{}, time.Millisecond, nil)
	assert.ErrorIs(t, err, os.ErrNotExist)
}
