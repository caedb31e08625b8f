package executor

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/spool"
	"github.com/taskrun/taskrun/workerclient"
)

// stalledSender never accepts a delta until its context ends, like a control
// plane that hangs.
type stalledSender struct{ returned chan struct{} }

func (s stalledSender) Send(ctx context.Context, _ string, _ workerclient.Delta) error {
	<-ctx.Done()
	close(s.returned)
	return ctx.Err()
}

func (stalledSender) End(context.Context, string, int64) error { return nil }

// A stalled stream consumer holds a finished run only for streamDrainTimeout;
// then it is cancelled, and its goroutine ends.
func TestFollowersGiveUpOnAStalledConsumer(t *testing.T) {
	defer func(d time.Duration) { streamDrainTimeout = d }(streamDrainTimeout)
	streamDrainTimeout = 200 * time.Millisecond

	sender := stalledSender{returned: make(chan struct{})}
	p := &plan{in: Input{StreamSender: sender}, ref: model.RunRef{RunID: "r1"}, log: slog.Default()}
	dir := t.TempDir()
	stdout, err := spool.New(filepath.Join(dir, "out"))
	require.NoError(t, err)
	stderr, err := spool.New(filepath.Join(dir, "err"))
	require.NoError(t, err)
	_, err = stdout.Write([]byte("bytes nobody takes"))
	require.NoError(t, err)

	f := follow(context.Background(), p, stdout, stderr, 0, 0)
	require.NoError(t, stdout.Close())
	require.NoError(t, stderr.Close())
	assert.Error(t, f.wait(), "the stall is reported")
	select {
	case <-sender.returned:
	case <-time.After(5 * time.Second):
		t.Fatal("the stalled consumer was never cancelled")
	}
}

// blockedWriter never returns from Write, like a paused terminal pager.
type blockedWriter struct{}

func (blockedWriter) Write([]byte) (int, error) { select {} }

// A live copy whose writer blocks holds a finished run only for
// streamDrainTimeout too, even though a blocked Write cannot be cancelled.
func TestFollowersDoNotWaitForABlockedWriter(t *testing.T) {
	defer func(d time.Duration) { streamDrainTimeout = d }(streamDrainTimeout)
	streamDrainTimeout = 200 * time.Millisecond

	p := &plan{in: Input{Stdout: blockedWriter{}}, ref: model.RunRef{RunID: "r1"}, log: slog.Default()}
	dir := t.TempDir()
	stdout, err := spool.New(filepath.Join(dir, "out"))
	require.NoError(t, err)
	stderr, err := spool.New(filepath.Join(dir, "err"))
	require.NoError(t, err)
	_, err = stdout.Write([]byte("to a pager that never reads"))
	require.NoError(t, err)
	require.NoError(t, stdout.Close())
	require.NoError(t, stderr.Close())

	done := make(chan error, 1)
	go func() { done <- follow(context.Background(), p, stdout, stderr, 0, 0).wait() }()
	select {
	case err := <-done:
		assert.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("a blocked writer held the run")
	}
}
