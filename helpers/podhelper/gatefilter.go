package podhelper

import (
	"bytes"
	"io"
	"sync"
)

// GateFilter passes the run container's stderr on to w without the gate's
// leading tokens and its open marker (GateOpen), and calls seen once, at
// the first token. Everything after the marker passes through, even bytes
// that look like a token.
type GateFilter struct {
	w       io.Writer
	seen    func()
	once    sync.Once
	pending []byte
	through bool
}

// NewGateFilter returns a GateFilter writing to w.
func NewGateFilter(w io.Writer, seen func()) *GateFilter {
	return &GateFilter{w: w, seen: seen}
}

// Write implements io.Writer.
func (f *GateFilter) Write(p []byte) (int, error) {
	if f.through {
		return f.w.Write(p)
	}
	f.pending = append(f.pending, p...)
	for {
		switch {
		case bytes.HasPrefix(f.pending, []byte(GateToken)):
			f.pending = f.pending[len(GateToken):]
			f.once.Do(f.seen)
			continue
		case bytes.HasPrefix(f.pending, []byte(GateOpen)):
			f.pending = f.pending[len(GateOpen):]
			f.through = true
		case len(f.pending) < len(GateToken) && bytes.HasPrefix([]byte(GateToken), f.pending),
			len(f.pending) < len(GateOpen) && bytes.HasPrefix([]byte(GateOpen), f.pending):
			return len(p), nil // maybe a token or the marker, not complete yet
		}
		break
	}
	f.through = true
	rest := f.pending
	f.pending = nil
	if len(rest) == 0 {
		return len(p), nil
	}
	if _, err := f.w.Write(rest); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what is held back as a possible token (a stream that ended
// inside one).
func (f *GateFilter) Flush() error {
	if len(f.pending) == 0 {
		return nil
	}
	rest := f.pending
	f.pending = nil
	f.through = true
	_, err := f.w.Write(rest)
	return err
}
