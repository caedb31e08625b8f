package changeset

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// cancellingReader yields its content one byte a read and calls cancel
// after the first.
type cancellingReader struct {
	r      io.Reader
	cancel func()
}

func (c *cancellingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p[:1])
	c.cancel()
	return n, err
}

// A file whose hashing outlives the deadline is recorded without a digest,
// and so is every file after it, without a read; the caller's own
// cancellation is an error.
func TestHashDeadlineStopsMidFile(t *testing.T) {
	b, cancel := newHashBudget(context.Background(), DefaultLimits)
	defer cancel()
	content := "0123456789"
	e := workspace.ScanEntry{RelPath: "f", Size: int64(len(content)), Allocated: 4096,
		Reader: &cancellingReader{r: strings.NewReader(content), cancel: cancel}}
	n, digest, reason, err := b.hash(context.Background(), e, io.Discard)
	require.NoError(t, err)
	assert.Empty(t, digest)
	assert.Contains(t, reason, "HashTimeout")
	assert.Less(t, n, int64(len(content)), "reading stopped at the deadline")

	unread := workspace.ScanEntry{RelPath: "g", Size: 1, Allocated: 4096, Reader: failingReader{t}}
	_, digest, reason, err = b.hash(context.Background(), unread, io.Discard)
	require.NoError(t, err)
	assert.Empty(t, digest)
	assert.Contains(t, reason, "HashTimeout")

	caller, stop := context.WithCancel(context.Background())
	b2, cancel2 := newHashBudget(caller, DefaultLimits)
	defer cancel2()
	e.Reader = &cancellingReader{r: strings.NewReader(content), cancel: stop}
	_, _, _, err = b2.hash(caller, e, io.Discard)
	assert.ErrorIs(t, err, context.Canceled)
}

type failingReader struct{ t *testing.T }

func (f failingReader) Read([]byte) (int, error) {
	f.t.Error("a file past the deadline was read")
	return 0, io.EOF
}
