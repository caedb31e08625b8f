package probe

import (
	"bytes"
	"io"
	"sync"
)

// Interceptor is an io.Writer filter for a container's stderr. It examines
// only the first line: if that line is a valid report line for its nonce, it
// keeps the report and drops the line; otherwise the line passes through.
// Everything after the first line passes through unchanged. It never holds
// more than MaxLine bytes: a first line longer than that is passed through as
// not-a-report.
type Interceptor struct {
	mu     sync.Mutex
	next   io.Writer
	nonce  string
	buf    []byte
	done   bool
	report *Report
}

// NewInterceptor returns an Interceptor that writes through to next and
// accepts only report lines carrying nonce.
func NewInterceptor(next io.Writer, nonce string) *Interceptor {
	return &Interceptor{next: next, nonce: nonce}
}

// Write implements io.Writer.
func (i *Interceptor) Write(p []byte) (int, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.done {
		return i.next.Write(p)
	}
	nl := bytes.IndexByte(p, '\n')
	if nl < 0 {
		if len(i.buf)+len(p) > MaxLine {
			return i.giveUp(p)
		}
		i.buf = append(i.buf, p...)
		return len(p), nil
	}
	if len(i.buf)+nl+1 > MaxLine {
		return i.giveUp(p)
	}
	i.buf = append(i.buf, p[:nl+1]...)
	if err := i.decide(); err != nil {
		return 0, err
	}
	n, err := i.next.Write(p[nl+1:])
	return nl + 1 + n, err
}

// giveUp passes the held bytes and p through: the first line is too long to
// be a report.
func (i *Interceptor) giveUp(p []byte) (int, error) {
	i.done = true
	held := i.buf
	i.buf = nil
	if _, err := i.next.Write(held); err != nil {
		return 0, err
	}
	return i.next.Write(p)
}

// decide classifies the complete first line held in buf.
func (i *Interceptor) decide() error {
	i.done = true
	line := i.buf
	i.buf = nil
	if r, err := ParseLine(line, i.nonce); err == nil {
		i.report = &r
		return nil
	}
	_, err := i.next.Write(line)
	return err
}

// Flush passes through a pending first line that never got its newline. Call
// it once the stream has ended.
func (i *Interceptor) Flush() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.done {
		return nil
	}
	i.done = true
	held := i.buf
	i.buf = nil
	if len(held) == 0 {
		return nil
	}
	if r, err := ParseLine(held, i.nonce); err == nil {
		i.report = &r
		return nil
	}
	_, err := i.next.Write(held)
	return err
}

// Report returns the captured report, if the first line was one.
func (i *Interceptor) Report() (*Report, bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.report, i.report != nil
}
