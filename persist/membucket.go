package persist

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"sort"
	"strings"
	"sync"
)

// errMemNotFound is a missing key of a memory bucket.
var errMemNotFound = errors.New("no such key")

// NewMemBucket returns an empty in-process Bucket (what mem:// opens), for
// tests and for drivers that stand in for one.
func NewMemBucket() Bucket { return &memBucket{objects: map[string]memObject{}} }

// memBucket is a Bucket in memory.
type memBucket struct {
	mu      sync.RWMutex
	objects map[string]memObject
}

type memObject struct {
	data  []byte
	attrs Attributes
}

// NewWriter implements Bucket.
func (b *memBucket) NewWriter(ctx context.Context, key string, opts WriterOptions) (io.WriteCloser, error) {
	if key == "" {
		return nil, errInvalidKey
	}
	return &memWriter{ctx: ctx, b: b, key: key, opts: opts}, nil
}

// memWriter buffers an object until Close.
type memWriter struct {
	ctx  context.Context
	b    *memBucket
	key  string
	opts WriterOptions
	buf  bytes.Buffer
}

func (w *memWriter) Write(p []byte) (int, error) { return w.buf.Write(p) }

func (w *memWriter) Close() error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	data := bytes.Clone(w.buf.Bytes())
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	w.b.objects[w.key] = memObject{data: data, attrs: Attributes{Size: int64(len(data)), ContentType: w.opts.ContentType, Metadata: maps.Clone(w.opts.Metadata)}}
	return nil
}

func (b *memBucket) get(key string) (memObject, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	o, ok := b.objects[key]
	if !ok {
		return memObject{}, errMemNotFound
	}
	return o, nil
}

// NewReader implements Bucket.
func (b *memBucket) NewReader(_ context.Context, key string) (io.ReadCloser, error) {
	o, err := b.get(key)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(o.data)), nil
}

// Attributes implements Bucket.
func (b *memBucket) Attributes(_ context.Context, key string) (Attributes, error) {
	o, err := b.get(key)
	if err != nil {
		return Attributes{}, err
	}
	a := o.attrs
	a.Metadata = maps.Clone(a.Metadata)
	return a, nil
}

// List implements Bucket.
func (b *memBucket) List(_ context.Context, prefix, delimiter string) ([]ListObject, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out []ListObject
	dirs := map[string]bool{}
	for key := range b.objects {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		if delimiter != "" {
			if i := strings.Index(key[len(prefix):], delimiter); i >= 0 {
				dir := prefix + key[len(prefix):][:i+len(delimiter)]
				if !dirs[dir] {
					dirs[dir] = true
					out = append(out, ListObject{Key: dir, IsDir: true})
				}
				continue
			}
		}
		out = append(out, ListObject{Key: key})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// IsAccessible implements Bucket.
func (b *memBucket) IsAccessible(context.Context) (bool, error) { return true, nil }

// ErrorCode implements Bucket.
func (b *memBucket) ErrorCode(err error) ErrorCode {
	switch {
	case errors.Is(err, errMemNotFound):
		return CodeNotFound
	case errors.Is(err, errInvalidKey):
		return CodeInvalidArgument
	default:
		return CodeUnknown
	}
}

// Close implements Bucket.
func (b *memBucket) Close() error { return nil }
