package webui_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/webui"
	"github.com/taskrun/taskrun/workerclient"
)

func send(t *testing.T, s *webui.Streams, off int64, data string) error {
	t.Helper()
	return s.Send(context.Background(), "r1", workerclient.Delta{Offset: off, Data: []byte(data)})
}

// Streams applies the stream endpoint's offset rules: duplicates and
// overlaps are dropped, gaps and bytes past the end refused.
func TestStreamsOffsetRules(t *testing.T) {
	s := webui.NewStreams(0, 0)
	require.NoError(t, send(t, s, 0, "hello "))
	require.NoError(t, send(t, s, 0, "hello "), "a duplicate")
	require.NoError(t, send(t, s, 3, "lo world"), "an overlap")
	require.ErrorIs(t, send(t, s, 20, "gap"), workerclient.ErrStreamGap)
	require.ErrorIs(t, s.End(context.Background(), "r1", 5), workerclient.ErrStreamGap, "a wrong total")
	require.NoError(t, s.End(context.Background(), "r1", 11))
	require.ErrorIs(t, send(t, s, 11, "more"), workerclient.ErrStreamGap, "bytes past the end")

	c, ok, err := s.Follow(context.Background(), "r1", 0, 1<<20)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "hello world", string(c.Data))
	assert.True(t, c.Ended)
	_, ok, err = s.Follow(context.Background(), "other", 0, 10)
	require.NoError(t, err)
	assert.False(t, ok, "no stream of that run")
}

// A follower waits for bytes past its offset and gets them when they come.
func TestStreamsFollowWaits(t *testing.T) {
	s := webui.NewStreams(0, 0)
	require.NoError(t, send(t, s, 0, "ab"))
	got := make(chan webui.Chunk, 1)
	go func() {
		c, _, _ := s.Follow(context.Background(), "r1", 2, 100)
		got <- c
	}()
	select {
	case c := <-got:
		t.Fatalf("Follow returned %q before any byte past its offset", c.Data)
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, send(t, s, 2, "cd"))
	c := <-got
	assert.Equal(t, int64(2), c.Offset)
	assert.Equal(t, "cd", string(c.Data))
	assert.False(t, c.Ended)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := s.Follow(ctx, "r1", 4, 100)
	assert.ErrorIs(t, err, context.Canceled)
}

// What a Streams keeps is bounded: the newest bytes of each run, and a
// bounded number of runs, forgetting ended ones first.
func TestStreamsAreBounded(t *testing.T) {
	s := webui.NewStreams(4, 2)
	require.NoError(t, send(t, s, 0, "0123456789"))
	c, _, err := s.Follow(context.Background(), "r1", 0, 100)
	require.NoError(t, err)
	assert.Equal(t, int64(6), c.Offset, "a follower of an older offset starts at the oldest byte kept")
	assert.Equal(t, "6789", string(c.Data))

	ctx := context.Background()
	require.NoError(t, s.Send(ctx, "r2", workerclient.Delta{Data: []byte("x")}))
	require.Error(t, s.Send(ctx, "r3", workerclient.Delta{Data: []byte("x")}), "two live streams and none ended")
	require.NoError(t, s.End(ctx, "r1", 10))
	require.NoError(t, s.Send(ctx, "r3", workerclient.Delta{Data: []byte("x")}))
	assert.False(t, s.Has("r1"), "the ended stream was forgotten")
	assert.True(t, s.Has("r2"))
}
