package persist

import (
	"context"
	"io"
)

// Bucket is the object store a Store keeps its keys in: what a store
// driver implements. The file:// and mem:// buckets are built in; drivers
// for other schemes (package persist/s3) register an Opener that returns
// one.
type Bucket interface {
	// NewWriter starts writing key. Nothing is visible until Close returns
	// nil; when ctx is done before Close, Close commits nothing and fails.
	NewWriter(ctx context.Context, key string, opts WriterOptions) (io.WriteCloser, error)
	// NewReader opens key for reading.
	NewReader(ctx context.Context, key string) (io.ReadCloser, error)
	// Attributes describes key.
	Attributes(ctx context.Context, key string) (Attributes, error)
	// List returns the objects whose keys start with prefix, sorted by
	// key. With a delimiter, keys that have it after prefix collapse into
	// one directory entry each (IsDir, its key ending in the delimiter).
	List(ctx context.Context, prefix, delimiter string) ([]ListObject, error)
	// IsAccessible reports whether the bucket exists and can be used.
	IsAccessible(ctx context.Context) (bool, error)
	// ErrorCode classifies an error the bucket returned.
	ErrorCode(err error) ErrorCode
	// Close releases the bucket.
	Close() error
}

// WriterOptions is what a Bucket stores with an object.
type WriterOptions struct {
	// ContentType is the object's MIME type.
	ContentType string
	// Metadata is the object's metadata, read back through Attributes.
	Metadata map[string]string
}

// Attributes describes a stored object.
type Attributes struct {
	Size        int64
	ContentType string
	Metadata    map[string]string
}

// ListObject is one entry of a Bucket listing.
type ListObject struct {
	Key   string
	IsDir bool
}

// ErrorCode is what kind of failure a Bucket error is: it decides whether
// the store retries it and what the caller's error wraps.
type ErrorCode int

// The error codes; the zero value is CodeUnknown, which the store treats
// as transient.
const (
	// CodeUnknown is an error of no known kind: transient.
	CodeUnknown ErrorCode = iota
	// CodeNotFound is a missing object: ErrNotFound.
	CodeNotFound
	// CodeInternal is a failure inside the store: transient.
	CodeInternal
	// CodeResourceExhausted is throttling or a full quota: transient.
	CodeResourceExhausted
	// CodeDeadlineExceeded is a request that timed out: transient.
	CodeDeadlineExceeded
	// CodeInvalidArgument is a key or option the bucket refuses:
	// ErrKeyRejected.
	CodeInvalidArgument
	// CodeFailed is any other definite answer (denied, precondition
	// failed): neither retried nor classified further.
	CodeFailed
)

// readAll reads the whole object at key.
func readAll(ctx context.Context, b Bucket, key string) ([]byte, error) {
	r, err := b.NewReader(ctx, key)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(r)
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	return data, err
}

// writeAll writes data to key in one go.
func writeAll(ctx context.Context, b Bucket, key string, data []byte, opts WriterOptions) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := b.NewWriter(wctx, key, opts)
	if err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		cancel()
		_ = w.Close()
		return err
	}
	return w.Close()
}
