package changeset

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/taskrun/taskrun/workspace"
)

// errHashDeadline is what a hashing read returns once the tree's hashing
// deadline (Limits.HashTimeout) has passed.
var errHashDeadline = errors.New("hashing deadline passed")

// hashBudget bounds what hashing one tree costs the host: only bytes the
// filesystem really allocated are hashed (a sparse file is not read at
// all), at most Limits.MaxHashBytes of them, and none after
// Limits.HashTimeout. A file past a bound is recorded without a digest and
// with the reason, and the scan goes on listing the rest.
type hashBudget struct {
	// deadline is done once HashTimeout has passed (or the caller's
	// context is done, which the caller tells apart).
	deadline context.Context
	timeout  time.Duration
	max      int64
	left     int64
}

// newHashBudget starts the hashing clock of one tree; cancel releases it.
func newHashBudget(ctx context.Context, lim Limits) (*hashBudget, context.CancelFunc) {
	deadline, cancel := context.WithTimeout(ctx, lim.HashTimeout)
	return &hashBudget{deadline: deadline, timeout: lim.HashTimeout, max: lim.MaxHashBytes, left: lim.MaxHashBytes}, cancel
}

// admit returns why e must not be hashed, or "" after counting its bytes
// against the budget.
func (b *hashBudget) admit(e workspace.ScanEntry) string {
	switch {
	case workspace.IsSparse(e.Size, e.Allocated):
		return fmt.Sprintf("not hashed: sparse file of %d bytes with only %d allocated (holes are not read)", e.Size, e.Allocated)
	case b.deadline.Err() != nil:
		return b.deadlineReason()
	case e.Size > b.left:
		return fmt.Sprintf("not hashed: the %d-byte hashing budget (MaxHashBytes) was spent", b.max)
	}
	b.left -= e.Size
	return ""
}

func (b *hashBudget) deadlineReason() string {
	return fmt.Sprintf("not hashed: the %s hashing deadline (HashTimeout) passed", b.timeout)
}

// hash copies e's content to dst and returns its hex SHA-256, or the reason
// it was not hashed: over a bound before it was read, or the deadline
// passing while it was. An error is a failed read, or ctx (the caller's)
// being done.
// n is how much of it was written to dst.
func (b *hashBudget) hash(ctx context.Context, e workspace.ScanEntry, dst io.Writer) (n int64, digest, notHashed string, err error) {
	if reason := b.admit(e); reason != "" {
		return 0, "", reason, nil
	}
	h := sha256.New()
	n, err = io.Copy(io.MultiWriter(dst, h), &deadlineReader{r: e.Reader, deadline: b.deadline})
	switch {
	case err == nil:
		return n, hex.EncodeToString(h.Sum(nil)), "", nil
	case ctx.Err() != nil:
		return n, "", "", ctx.Err()
	case errors.Is(err, errHashDeadline):
		return n, "", b.deadlineReason(), nil
	}
	return n, "", "", err
}

// deadlineReader fails every read once deadline is done, so that one huge
// file cannot hold the scan past it.
type deadlineReader struct {
	r        io.Reader
	deadline context.Context
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if d.deadline.Err() != nil {
		return 0, errHashDeadline
	}
	return d.r.Read(p)
}
