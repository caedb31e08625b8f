package probe

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testdeadline"
)

func holdPath(t *testing.T) string {
	return filepath.Join(t.TempDir(), ".hold", "audit.sock")
}

// releaseAndAwait holds at path, releases the hold and checks that the
// self-check's wait on it gets the go-ahead.
func releaseAndAwait(t *testing.T, path string) {
	t.Helper()
	h, err := ListenHold(path, os.Getuid(), "n1")
	require.NoError(t, err)
	released := make(chan error, 1)
	go func() { released <- h.Release(context.Background()) }()
	require.NoError(t, AwaitGoAhead(context.Background(), path, "n1", 10*time.Second))
	// The agent starts on the go-ahead: by then nothing of the hold is
	// left in its run directory.
	assert.NoFileExists(t, path, "the socket is gone before the go-ahead arrives")
	assert.NoDirExists(t, filepath.Dir(path), "its directory is gone before the go-ahead arrives")
	require.NoError(t, <-released)
}

func TestHoldReleaseLetsTheAgentStart(t *testing.T) {
	path := holdPath(t)
	releaseAndAwait(t, path)
	assert.NoFileExists(t, path, "the socket is gone once used")
	assert.NoDirExists(t, filepath.Dir(path))
}

func TestHoldCloseRefusesTheAgent(t *testing.T) {
	path := holdPath(t)
	h, err := ListenHold(path, os.Getuid(), "n1")
	require.NoError(t, err)
	waiting := make(chan error, 1)
	go func() { waiting <- AwaitGoAhead(context.Background(), path, "n1", 10*time.Second) }()
	// The self-check is queued on the socket, or about to be.
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, h.Close())
	err = <-waiting
	require.ErrorIs(t, err, ErrNoGoAhead)

	err = AwaitGoAhead(context.Background(), path, "n1", 10*time.Second)
	require.ErrorIs(t, err, ErrNoGoAhead, "a self-check asking after the refusal is refused too")
	require.NoError(t, h.Close(), "closing again is harmless")

	// Release after Close gives no go-ahead.
	assert.Error(t, h.Release(context.Background()))
}

func TestHoldReleaseEndsWhenTheRunEnds(t *testing.T) {
	h, err := ListenHold(holdPath(t), os.Getuid(), "n1")
	require.NoError(t, err)
	released := make(chan error, 1)
	go func() { released <- h.Release(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, h.Close())
	assert.Error(t, <-released, "no self-check asked")

	h, err = ListenHold(holdPath(t), os.Getuid(), "n1")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { released <- h.Release(ctx) }()
	cancel()
	assert.ErrorIs(t, <-released, context.Canceled)
}

func TestAwaitGoAheadRefusesAnythingElse(t *testing.T) {
	// A host that says nothing holds the connection open until the test
	// ends: only the wait's own timeout can end the wait.
	silent := make(chan struct{})
	t.Cleanup(func() { close(silent) })
	serve := func(t *testing.T, answer string) string {
		path := filepath.Join(t.TempDir(), "s")
		ln, err := net.Listen("unix", path)
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			if answer != "" {
				_, _ = c.Write([]byte(answer))
				return
			}
			<-silent // says nothing
		}()
		return path
	}
	for name, answer := range map[string]string{
		"another run's go-ahead": goAhead("other"),
		"a line without nonce":   "TASKRUN-GO\n",
		"no newline":             "TASKRUN-GO n1",
		"an endless line":        strings.Repeat("x", 10*maxHoldLine),
	} {
		err := AwaitGoAhead(context.Background(), serve(t, answer), "n1", 10*time.Second)
		assert.ErrorIs(t, err, ErrNoGoAhead, name)
	}
	waited := make(chan error, 1)
	go func() { waited <- AwaitGoAhead(context.Background(), serve(t, ""), "n1", 100*time.Millisecond) }()
	select {
	case err := <-waited:
		assert.ErrorIs(t, err, ErrNoGoAhead, "a host that never answers")
	case <-time.After(testdeadline.Scale(30 * time.Second)): // returns after 100 ms; bounds a wait that never does
		t.Fatal("the wait on a host that never answers is not bounded by its timeout")
	}
	assert.ErrorIs(t, AwaitGoAhead(context.Background(), filepath.Join(t.TempDir(), "none"), "n1", time.Second), ErrNoGoAhead, "no socket")
}

// Run directories deep in a host's tree have socket paths longer than
// bind(2) and connect(2) take.
func TestHoldOnALongPath(t *testing.T) {
	dir := t.TempDir()
	for len(dir) < 150 {
		dir = filepath.Join(dir, "a-long-directory-name")
	}
	releaseAndAwait(t, filepath.Join(dir, ".hold", "audit.sock"))
}
