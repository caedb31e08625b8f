package workerclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// ErrStreamGap is wrapped by WriterStreamSender errors for a delta that starts
// after the next expected offset, or an End whose total differs from it.
var ErrStreamGap = errors.New("workerclient: stream offsets are not contiguous")

// TerminalUpdater reports run status without a control plane: each update is
// written to w as one line, "PATCH /v1/task-runs/{id} {json}".
type TerminalUpdater struct {
	mu sync.Mutex
	w  io.Writer
}

// NewTerminalUpdater returns a TerminalUpdater writing to w (e.g. os.Stderr).
func NewTerminalUpdater(w io.Writer) *TerminalUpdater { return &TerminalUpdater{w: w} }

// UpdateRunStatus writes the PATCH the HTTP client would send as one line.
func (u *TerminalUpdater) UpdateRunStatus(_ context.Context, taskRunID string, req *PatchTaskRunRequest) error {
	if err := ValidateTaskRunID(taskRunID); err != nil {
		return err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("workerclient: encode status of run %s: %w", taskRunID, err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, err := fmt.Fprintf(u.w, "PATCH /v1/task-runs/%s %s\n", taskRunID, body); err != nil {
		return fmt.Errorf("workerclient: write status of run %s: %w", taskRunID, err)
	}
	return nil
}

// WriterStreamSender is a StreamSender that writes delta bytes verbatim to w,
// applying the server's offset rules: bytes already written are skipped and a
// gap is an error, so a resent delta never duplicates output.
type WriterStreamSender struct {
	mu   sync.Mutex
	w    io.Writer
	next map[string]int64
}

// NewWriterStreamSender returns a WriterStreamSender writing to w (e.g. os.Stdout).
func NewWriterStreamSender(w io.Writer) *WriterStreamSender {
	return &WriterStreamSender{w: w, next: map[string]int64{}}
}

// Send writes the bytes of d not written before.
func (s *WriterStreamSender) Send(_ context.Context, taskRunID string, d Delta) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.next[taskRunID]
	if d.Offset > next {
		return fmt.Errorf("%w: run %s delta at offset %d, expected %d", ErrStreamGap, taskRunID, d.Offset, next)
	}
	skip := min(next-d.Offset, int64(len(d.Data)))
	n, err := s.w.Write(d.Data[skip:])
	s.next[taskRunID] = next + int64(n)
	if err != nil {
		return fmt.Errorf("workerclient: write stream of run %s: %w", taskRunID, err)
	}
	return nil
}

// End checks that totalBytes matches what was written.
func (s *WriterStreamSender) End(_ context.Context, taskRunID string, totalBytes int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if next := s.next[taskRunID]; next != totalBytes {
		return fmt.Errorf("%w: run %s ended at %d bytes but %d were written", ErrStreamGap, taskRunID, totalBytes, next)
	}
	return nil
}
