package controlplanetest

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/taskrun/taskrun/workerclient"
)

// Recorder is an in-process control plane for tests that need no HTTP: a
// TaskRunUpdater and StreamSender that keeps every PATCH and the stream, and
// refuses a delta that does not continue the stream or an end marker whose
// total is off. It is safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	patches []workerclient.PatchTaskRunRequest
	stream  bytes.Buffer
	ended   bool
	total   int64
}

// UpdateRunStatus records req.
func (r *Recorder) UpdateRunStatus(_ context.Context, _ string, req *workerclient.PatchTaskRunRequest) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.patches = append(r.patches, *req)
	return nil
}

// Send appends d, which must start where the stream ends.
func (r *Recorder) Send(_ context.Context, _ string, d workerclient.Delta) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d.Offset != int64(r.stream.Len()) {
		return fmt.Errorf("controlplanetest: delta at offset %d, stream has %d bytes", d.Offset, r.stream.Len())
	}
	r.stream.Write(d.Data)
	return nil
}

// End records the end of the stream, whose total must match what arrived.
func (r *Recorder) End(_ context.Context, _ string, total int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if total != int64(r.stream.Len()) {
		return fmt.Errorf("controlplanetest: stream ended at %d bytes, received %d", total, r.stream.Len())
	}
	r.ended, r.total = true, total
	return nil
}

// Patches returns the PATCHes received so far, in order.
func (r *Recorder) Patches() []workerclient.PatchTaskRunRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]workerclient.PatchTaskRunRequest(nil), r.patches...)
}

// Last returns the latest PATCH; ok is false when none arrived.
func (r *Recorder) Last() (req workerclient.PatchTaskRunRequest, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.patches) == 0 {
		return req, false
	}
	return r.patches[len(r.patches)-1], true
}

// Stream returns the bytes received, whether the end marker arrived, and
// the total it announced.
func (r *Recorder) Stream() (data []byte, ended bool, total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.stream.Bytes()), r.ended, r.total
}
