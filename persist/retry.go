package persist

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/taskrun/taskrun/internal/backoff"
)

// ErrStoreUnavailable marks a failure that looks transient (network error,
// 5xx, throttling) and persisted through the store's retries: the store is
// down or unreachable. Callers keep their local data and retry later.
var ErrStoreUnavailable = errors.New("persist: blob store unavailable")

// ErrNotFound marks a missing object.
var ErrNotFound = errors.New("persist: object not found")

// ErrKeyRejected marks a definite refusal of one key by a store that is
// otherwise working: the file store cannot put an object where another
// one's directory is ("a" when "a/b" exists, or the reverse), or the store
// refuses the name as invalid. Retrying the same key fails the same way;
// the caller skips the object and keeps the others.
var ErrKeyRejected = errors.New("persist: the store refused this key")

// retryPolicy bounds the store's own retries of whole operations.
type retryPolicy struct {
	attempts int
	// backoff spaces the retries: exponential, capped, upper half jittered.
	backoff backoff.Exponential
}

var defaultRetry = retryPolicy{
	attempts: 3,
	backoff:  backoff.Exponential{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: true},
}

// sourceError marks a failure reading the caller's upload source: it is never
// the store's fault, so it is neither retried nor reported as unavailability.
type sourceError struct{ err error }

func (e *sourceError) Error() string { return "persist: read upload source: " + e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// statusCoder is implemented by SDK response errors that carry an HTTP status
// (e.g. the AWS SDK's ResponseError).
type statusCoder interface{ HTTPStatusCode() int }

// transient reports whether err may go away on retry. A done ctx, a source
// error and every definite answer from the store (not found, denied, invalid,
// precondition failed) are not transient.
func (s *Store) transient(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, ErrSourceChanged) {
		return false
	}
	var se *sourceError
	if errors.As(err, &se) || s.keyRejected(err) {
		return false
	}
	// A status of 0 means no response arrived (connection refused, reset).
	var sc statusCoder
	if errors.As(err, &sc) && sc.HTTPStatusCode() != 0 {
		c := sc.HTTPStatusCode()
		return c >= 500 || c == 429 || c == 408
	}
	switch s.bucket.ErrorCode(err) {
	case CodeUnknown, CodeInternal, CodeResourceExhausted, CodeDeadlineExceeded:
		return true
	default:
		return false
	}
}

// classify wraps err from op on key with ErrNotFound, ErrStoreUnavailable or
// a plain context so callers can test it with errors.Is.
func (s *Store) classify(ctx context.Context, op, key string, err error) error {
	switch {
	case s.bucket.ErrorCode(err) == CodeNotFound && !isSource(err):
		return fmt.Errorf("%w: %s %s: %w", ErrNotFound, op, key, err)
	case s.keyRejected(err):
		return fmt.Errorf("%w: %s %s: %w", ErrKeyRejected, op, key, err)
	case s.transient(ctx, err), deadlineHit(ctx, err):
		return fmt.Errorf("%w: %s %s: %w", ErrStoreUnavailable, op, key, err)
	default:
		return fmt.Errorf("persist: %s %s: %w", op, key, err)
	}
}

// deadlineHit reports whether the caller's deadline ran out while the store
// had not answered: from the caller's side the store is unavailable.
func deadlineHit(ctx context.Context, err error) bool {
	return errors.Is(ctx.Err(), context.DeadlineExceeded) && !isSource(err)
}

// keyRejected reports whether err is the store's definite refusal of a key:
// the file driver's "not a directory", "is a directory", "file exists" (a
// directory in the way of a rename), "directory not empty" or "file name
// too long", or an invalid-argument answer.
func (s *Store) keyRejected(err error) bool {
	if isSource(err) {
		return false
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ENOTDIR, syscall.EISDIR, syscall.EEXIST, syscall.ENOTEMPTY, syscall.ENAMETOOLONG:
			return true
		}
	}
	return s.bucket.ErrorCode(err) == CodeInvalidArgument
}

func isSource(err error) bool {
	var se *sourceError
	return errors.As(err, &se)
}

// do runs f until it succeeds, fails with a non-transient error, or the
// policy's attempts are used up; the final error is classified.
func (s *Store) do(ctx context.Context, op, key string, f func(context.Context) error) error {
	var err error
	for attempt := 1; ; attempt++ {
		if err = f(ctx); err == nil {
			return nil
		}
		if !s.transient(ctx, err) || attempt >= s.retry.attempts {
			break
		}
		d := s.retry.backoff.Delay(attempt)
		slog.DebugContext(ctx, "persist: retrying after transient error",
			"op", op, "key", key, "attempt", attempt, "delay", d, "err", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			if deadlineHit(ctx, err) {
				return fmt.Errorf("%w: %s %s: %w (last error: %w)", ErrStoreUnavailable, op, key, ctx.Err(), err)
			}
			return fmt.Errorf("persist: %s %s: %w (last error: %w)", op, key, ctx.Err(), err)
		case <-t.C:
		}
	}
	return s.classify(ctx, op, key, err)
}
