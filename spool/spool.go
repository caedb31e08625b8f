// Package spool is a file-backed, append-only byte buffer with tail-following
// readers. A container's output is written to a Spool at disk speed, while any
// number of readers (the stream pump, a live log view) follow it at their own
// pace: a slow or stalled reader never blocks the writer, and no byte is held in
// memory beyond a reader's own read buffer.
package spool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// ErrClosed is returned by Write after Close.
var ErrClosed = errors.New("spool: write after close")

// ErrReaderClosed is returned by Read after the Reader's Close.
var ErrReaderClosed = errors.New("spool: read after reader close")

// ErrNoSpace is wrapped (next to syscall.ENOSPC) by the error of a Write that
// failed because the spool's filesystem is full. Every byte written before
// stays in the file and readable; Lost counts what was refused after.
var ErrNoSpace = errors.New("spool: the host filesystem is full")

// ErrTruncated is returned by Read when the file holds fewer bytes than were
// written to the spool, i.e. someone else truncated or replaced it.
var ErrTruncated = errors.New("spool: file truncated")

// Spool is an append-only file that readers can follow while it grows. Write
// and Close may be called from any goroutine; writes are serialized.
type Spool struct {
	path string

	wmu sync.Mutex // serializes writes to f
	f   *os.File

	// limit caps the bytes kept; 0 means no cap (see WithLimit).
	limit int64
	// budget, when set, grants the bytes kept (see WithBudget).
	budget Budget

	mu      sync.Mutex // guards the fields below
	size    int64
	dropped int64
	lost    int64
	closed  bool
	werr    error
	notify  chan struct{} // closed and replaced whenever size or closed changes
}

// Option configures a Spool.
type Option func(*Spool)

// WithLimit caps the spool at n bytes: what is written past the cap is
// accepted and counted (Dropped) but not kept, so a flooding writer can
// neither fill the disk nor be blocked. n <= 0 means no cap.
func WithLimit(n int64) Option { return func(s *Spool) { s.limit = max(n, 0) } }

// Budget grants bytes from a budget shared with other writers, such as a
// run's records.Budget: Take returns how many of n bytes may be kept.
type Budget interface {
	Take(n int64) int64
}

// WithBudget makes the spool keep only the bytes b grants, on top of any
// WithLimit: what b refuses is accepted and counted (Dropped) but not kept.
func WithBudget(b Budget) Option { return func(s *Spool) { s.budget = b } }

// New creates (or truncates) the file at path and returns a Spool appending to
// it. The file is left in place after Close so it can be persisted as the run's
// output log; removing it is the caller's job.
func New(path string, opts ...Option) (*Spool, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spool: create %s (the directory must exist and be writable): %w", path, err)
	}
	s := &Spool{path: path, f: f, notify: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Path returns the file the spool writes to.
func (s *Spool) Path() string { return s.path }

// Write appends p to the file and wakes every waiting reader. It never waits
// for readers. After a failed write the spool is broken and every later Write
// returns the same error.
func (s *Spool) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	closed, werr := s.closed, s.werr
	s.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	if werr != nil {
		s.mu.Lock()
		s.lost += int64(len(p))
		s.mu.Unlock()
		return 0, werr
	}
	keep := p
	if s.limit > 0 {
		keep = p[:min(int64(len(p)), max(s.limit-s.Size(), 0))]
	}
	if s.budget != nil && len(keep) > 0 {
		keep = keep[:s.budget.Take(int64(len(keep)))]
	}
	n, err := s.f.Write(keep)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.size += int64(n)
	if err != nil {
		s.lost += int64(len(p) - n)
		if errors.Is(err, syscall.ENOSPC) {
			err = fmt.Errorf("%w after %d bytes were kept: %w", ErrNoSpace, s.size, err)
		}
		s.werr = fmt.Errorf("spool: write %s: %w", s.path, err)
		s.wakeLocked()
		return n, s.werr
	}
	s.dropped += int64(len(p) - len(keep))
	s.wakeLocked()
	return len(p), nil
}

// Dropped returns how many bytes were written past the limit and not kept.
func (s *Spool) Dropped() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Lost returns how many bytes Write refused because of a write error (see
// Err): unlike Dropped, these were meant to be kept.
func (s *Spool) Lost() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// Err returns the error that broke the spool, if any; it wraps ErrNoSpace
// and syscall.ENOSPC when the filesystem filled up.
func (s *Spool) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.werr
}

// Close ends the spool: readers drain what was written and then get io.EOF.
// Close is idempotent; it returns the error of closing the file, if any.
func (s *Spool) Close() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.wakeLocked()
	if err := s.f.Close(); err != nil {
		return fmt.Errorf("spool: close %s: %w", s.path, err)
	}
	return nil
}

// Size returns the number of bytes written so far.
func (s *Spool) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// wakeLocked releases every reader waiting on the current notification channel.
func (s *Spool) wakeLocked() {
	close(s.notify)
	s.notify = make(chan struct{})
}

// state returns what a reader needs to decide whether to read, stop or wait.
func (s *Spool) state() (size int64, closed bool, changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size, s.closed, s.notify
}

// NewReader returns a Reader that starts at byte offset and follows the spool
// until it is closed. It is NewReaderContext with context.Background().
func (s *Spool) NewReader(offset int64) *Reader {
	return s.NewReaderContext(context.Background(), offset)
}

// NewReaderContext returns a Reader that starts at byte offset and follows the
// spool. Read blocks while no new bytes exist; it returns ctx.Err() once ctx is
// done and io.EOF once the spool is closed and fully read.
func (s *Spool) NewReaderContext(ctx context.Context, offset int64) *Reader {
	r := &Reader{s: s, ctx: ctx, off: offset, done: make(chan struct{})}
	if offset < 0 {
		r.err = fmt.Errorf("spool: reader offset %d is negative; use 0 to read from the start", offset)
		return r
	}
	f, err := os.Open(s.path)
	if err != nil {
		r.err = fmt.Errorf("spool: open %s for reading: %w", s.path, err)
		return r
	}
	r.f = f
	return r
}

// Reader follows a Spool like `tail -f`. A Reader is used from one goroutine;
// Close may be called from another to unblock a waiting Read.
type Reader struct {
	s   *Spool
	ctx context.Context
	f   *os.File
	off int64
	err error

	closeOnce sync.Once
	done      chan struct{}
}

// Read reads up to len(p) bytes that are already in the spool, waiting for the
// writer when there are none. It returns io.EOF after the last byte of a closed
// spool, the context's error when it is done, and ErrReaderClosed after Close.
func (r *Reader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	select {
	case <-r.done:
		return 0, ErrReaderClosed
	default:
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		size, closed, changed := r.s.state()
		if r.off < size {
			return r.readAvailable(p, size)
		}
		if closed {
			return 0, io.EOF
		}
		select {
		case <-changed:
		case <-r.ctx.Done():
			return 0, r.ctx.Err()
		case <-r.done:
			return 0, ErrReaderClosed
		}
	}
}

// readAvailable reads bytes in [r.off, size) into p.
func (r *Reader) readAvailable(p []byte, size int64) (int, error) {
	if avail := size - r.off; int64(len(p)) > avail {
		p = p[:avail]
	}
	n, err := r.f.ReadAt(p, r.off)
	r.off += int64(n)
	switch {
	case n > 0:
		return n, nil // a short read's error, if real, recurs on the next call
	case errors.Is(err, io.EOF):
		return 0, fmt.Errorf("spool: %s is shorter than the %d bytes written; it must not be truncated or replaced while in use: %w", r.s.path, size, ErrTruncated)
	default:
		return 0, fmt.Errorf("spool: read %s at %d: %w", r.s.path, r.off, err)
	}
}

// Offset returns the offset of the next byte Read will return.
func (r *Reader) Offset() int64 { return r.off }

// Close releases the Reader's file and makes a waiting or later Read return
// ErrReaderClosed. It is idempotent.
func (r *Reader) Close() error {
	var err error
	r.closeOnce.Do(func() {
		close(r.done)
		if r.f != nil {
			err = r.f.Close()
		}
	})
	return err
}
