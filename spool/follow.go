package spool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// FollowFile copies the spool file at path, written by another process, to
// w from its start and keeps copying as it grows, like `tail -f`. It polls
// every poll interval once it has caught up, and returns when the file has
// been removed or replaced (the run ended and its directory was released),
// when done reports true after a catch-up, or when ctx ends. It returns the
// number of bytes copied; a missing file wraps os.ErrNotExist.
func FollowFile(ctx context.Context, path string, w io.Writer, poll time.Duration, done func() bool) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("spool: follow: %w", err)
	}
	defer f.Close()
	opened, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("spool: follow: %w", err)
	}
	poll = max(poll, 10*time.Millisecond)
	var total int64
	buf := make([]byte, 64<<10)
	for {
		n, err := io.CopyBuffer(w, struct{ io.Reader }{f}, buf)
		total += n
		if err != nil {
			return total, fmt.Errorf("spool: follow: %w", err)
		}
		// Caught up: stop if the file is gone, replaced, or done says so.
		now, statErr := os.Stat(path)
		if errors.Is(statErr, os.ErrNotExist) || (statErr == nil && !os.SameFile(opened, now)) {
			n, err := io.CopyBuffer(w, struct{ io.Reader }{f}, buf) // what was written before the removal
			return total + n, err
		}
		if done != nil && done() {
			n, err := io.CopyBuffer(w, struct{ io.Reader }{f}, buf)
			return total + n, err
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(poll):
		}
	}
}
