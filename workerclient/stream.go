package workerclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
)

// Headers of the stream wire format (see docs/control-plane-api.md).
const (
	// HeaderOffset carries the stream byte offset of a POST body's first byte.
	HeaderOffset = "X-Taskrun-Offset"
	// HeaderEnd is "true" on the final, empty POST that ends the stream.
	HeaderEnd = "X-Taskrun-End"
	// HeaderTotal carries the stream's total byte count on the end POST.
	HeaderTotal = "X-Taskrun-Total"
	// HeaderNext is set by the server on answers: the offset it expects next.
	HeaderNext = "X-Taskrun-Next"
)

// MaxPostBytes is the largest body the HTTP stream sender puts in one POST;
// larger deltas are split. Servers must accept bodies of this size.
const MaxPostBytes = 1 << 20

// HTTPStreamSender is a StreamSender that POSTs deltas to
// /v1/task-runs/{id}/stream as raw bytes with their offset in X-Taskrun-Offset.
// Every POST is retried like UpdateRunStatus; because each carries its offset,
// a resend after a lost answer never duplicates bytes on the server. It sends
// each delta as it comes: batching is Pump's job.
type HTTPStreamSender struct {
	c *Client
}

// Stream returns the client's HTTP StreamSender.
func (c *Client) Stream() *HTTPStreamSender { return &HTTPStreamSender{c: c} }

// Send POSTs d, split into bodies of at most MaxPostBytes. It returns once the
// server acknowledged every byte, or with the error that ended the retries. It
// does not retain d.Data.
func (s *HTTPStreamSender) Send(ctx context.Context, taskRunID string, d Delta) error {
	if d.Offset < 0 {
		return fmt.Errorf("workerclient: delta offset %d is negative; offsets start at 0", d.Offset)
	}
	u, err := s.c.endpoint(taskRunID, "/stream")
	if err != nil {
		return err
	}
	for data, off := d.Data, d.Offset; len(data) > 0; {
		part := data[:min(len(data), MaxPostBytes)]
		if err := s.post(ctx, u, part, off); err != nil {
			return fmt.Errorf("workerclient: stream run %s bytes [%d, %d): %w", taskRunID, off, off+int64(len(part)), err)
		}
		data, off = data[len(part):], off+int64(len(part))
	}
	return nil
}

// post sends one part, retrying. The transport may go on reading a request
// body after the response arrived, so each attempt's body is fenced off before
// post returns: the caller may reuse part at once.
func (s *HTTPStreamSender) post(ctx context.Context, u string, part []byte, off int64) error {
	var bodies []*fencedBody
	defer func() {
		for _, b := range bodies {
			b.fence()
		}
	}()
	return s.c.do(ctx, func(ctx context.Context) (*http.Request, error) {
		body := &fencedBody{r: bytes.NewReader(part)}
		bodies = append(bodies, body)
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, u, body)
		if err != nil {
			return nil, err
		}
		r.ContentLength = int64(len(part))
		r.Header.Set("Content-Type", "application/octet-stream")
		r.Header.Set(HeaderOffset, strconv.FormatInt(off, 10))
		return r, nil
	})
}

// End POSTs the end marker: an empty body with X-Taskrun-End: true and the
// stream's total byte count in X-Taskrun-Total. It is idempotent.
func (s *HTTPStreamSender) End(ctx context.Context, taskRunID string, totalBytes int64) error {
	if totalBytes < 0 {
		return errors.New("workerclient: stream total must not be negative")
	}
	u, err := s.c.endpoint(taskRunID, "/stream")
	if err != nil {
		return err
	}
	err = s.c.do(ctx, func(ctx context.Context) (*http.Request, error) {
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, u, http.NoBody)
		if err != nil {
			return nil, err
		}
		r.Header.Set(HeaderEnd, "true")
		r.Header.Set(HeaderTotal, strconv.FormatInt(totalBytes, 10))
		return r, nil
	})
	if err != nil {
		return fmt.Errorf("workerclient: end stream of run %s at %d bytes: %w", taskRunID, totalBytes, err)
	}
	return nil
}

// errBodyFenced is what a request body read after its request finished gets.
var errBodyFenced = errors.New("workerclient: request body read after the request finished")

// fencedBody is a request body that stops reading the caller's buffer once
// fenced.
type fencedBody struct {
	mu     sync.Mutex
	r      *bytes.Reader
	fenced bool
}

func (b *fencedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fenced {
		return 0, errBodyFenced
	}
	return b.r.Read(p)
}

// fence waits for a Read in progress and makes every later Read fail.
func (b *fencedBody) fence() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fenced = true
}
