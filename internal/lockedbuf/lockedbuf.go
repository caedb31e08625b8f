// Package lockedbuf is a bytes.Buffer that tests can read while concurrent
// writers (a logger, an output stream, a stream sender) write to it, and
// wait on until something was written.
package lockedbuf

import (
	"bytes"
	"sync"
)

// Buffer is a mutex-guarded bytes.Buffer. The zero value is ready to use.
type Buffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	waiters []waiter
}

// waiter is a Seen call still waiting for its marker.
type waiter struct {
	marker []byte
	seen   chan struct{}
}

// Write appends p and wakes the Seen calls whose marker is now present.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	kept := b.waiters[:0]
	for _, w := range b.waiters {
		if bytes.Contains(b.buf.Bytes(), w.marker) {
			close(w.seen)
		} else {
			kept = append(kept, w)
		}
	}
	b.waiters = kept
	return n, err
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Seen returns a channel that is closed once marker has been written (at
// once if it already was), so a test waits for output as an event instead
// of polling.
func (b *Buffer) Seen(marker string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := waiter{marker: []byte(marker), seen: make(chan struct{})}
	if bytes.Contains(b.buf.Bytes(), w.marker) {
		close(w.seen)
	} else {
		b.waiters = append(b.waiters, w)
	}
	return w.seen
}
