package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"sync"
	"time"
)

// redacted replaces secrets in records and in bodies relayed to the agent.
const redacted = "[REDACTED]"

// MaxRecordedBodyBytes bounds what one exchange's record keeps of each body:
// a request or response body larger than this, and the stream events past
// it, are summarized (size and SHA-256), not stored.
const MaxRecordedBodyBytes = 256 << 10

// Why a body was summarized instead of recorded.
const (
	omitTooLarge     = "over the per-exchange record cap"
	omitBudget       = "model budget exhausted"
	omitRecordFailed = "the record refused an earlier write"
)

// exchange is one record line: a request from the agent and what came of it.
type exchange struct {
	Time       time.Time   `json:"ts"`
	Seq        int64       `json:"seq"`
	API        string      `json:"api,omitempty"`
	Path       string      `json:"path"`
	Stream     bool        `json:"stream"`
	Status     int         `json:"status"`
	DurationMS int64       `json:"duration_ms"`
	Usage      *tokenUsage `json:"usage,omitempty"`
	// UsageEstimated is true when the upstream reported no usage and Usage is the gateway's estimate.
	UsageEstimated bool            `json:"usage_estimated,omitempty"`
	Request        json.RawMessage `json:"request,omitempty"`
	// RequestSummary stands in for a request body that was not recorded.
	RequestSummary *bodySummary      `json:"request_summary,omitempty"`
	Response       json.RawMessage   `json:"response,omitempty"`
	ResponseSumm   *bodySummary      `json:"response_summary,omitempty"`
	Chunks         []json.RawMessage `json:"chunks,omitempty"`
	// ChunksOmitted counts the stream events past the record cap.
	ChunksOmitted int    `json:"chunks_omitted,omitempty"`
	Error         string `json:"error,omitempty"`

	// chunkBytes is what Chunks holds.
	chunkBytes int
}

// bodySummary describes a body the record does not keep.
type bodySummary struct {
	Bytes  int    `json:"bytes"`
	SHA256 string `json:"sha256"`
	Reason string `json:"reason"`
}

func summarize(body []byte, reason string) *bodySummary {
	sum := sha256.Sum256(body)
	return &bodySummary{Bytes: len(body), SHA256: hex.EncodeToString(sum[:]), Reason: reason}
}

// setRequest records a request body, or its summary when it is over the
// cap or when omit gives a reason to leave it out.
func (x *exchange) setRequest(body []byte, omit string) {
	switch {
	case omit != "":
		x.RequestSummary = summarize(body, omit)
	case len(body) > MaxRecordedBodyBytes:
		x.RequestSummary = summarize(body, omitTooLarge)
	case json.Valid(body):
		x.Request = json.RawMessage(body)
	}
}

// setResponse records a (redacted) response body, or its summary.
func (x *exchange) setResponse(body []byte) {
	switch {
	case len(body) > MaxRecordedBodyBytes:
		x.ResponseSumm = summarize(body, omitTooLarge)
	case json.Valid(body):
		x.Response = json.RawMessage(body)
	}
}

// addChunk records one (redacted) stream event while the record cap allows.
func (x *exchange) addChunk(payload []byte) {
	if x.chunkBytes+len(payload) > MaxRecordedBodyBytes {
		x.ChunksOmitted++
		return
	}
	x.chunkBytes += len(payload)
	x.Chunks = append(x.Chunks, json.RawMessage(payload))
}

// stripBodies leaves only the summaries.
func (x *exchange) stripBodies(reason string) {
	if x.Request != nil {
		x.RequestSummary = summarize(x.Request, reason)
		x.Request = nil
	}
	if x.Response != nil {
		x.ResponseSumm = summarize(x.Response, reason)
		x.Response = nil
	}
	x.ChunksOmitted += len(x.Chunks)
	x.Chunks, x.chunkBytes = nil, 0
}

// traceWriter appends exchanges as JSON lines, redacting the key. Once the
// writer refuses a line (a full disk, or the run's record budget spent), it
// writes only bodiless lines.
type traceWriter struct {
	mu       sync.Mutex
	w        io.Writer
	failed   bool
	redactor redactor
}

func newTraceWriter(w io.Writer, key string) *traceWriter {
	return &traceWriter{w: w, redactor: newRedactor(key)}
}

// write appends one exchange; record failures never fail the exchange.
func (t *traceWriter) write(x *exchange) error {
	if t.w == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failed {
		x.stripBodies(omitRecordFailed)
	}
	line, err := json.Marshal(x)
	if err != nil {
		return err
	}
	line = append(t.redactor.redact(line), '\n')
	if _, err = t.w.Write(line); err != nil {
		t.failed = true
	}
	return err
}

// redactor removes a secret in its raw and JSON-escaped forms.
type redactor struct{ forms [][]byte }

func newRedactor(secret string) redactor {
	if secret == "" {
		return redactor{}
	}
	quoted, _ := json.Marshal(secret)
	forms := [][]byte{[]byte(secret)}
	if escaped := quoted[1 : len(quoted)-1]; !bytes.Equal(escaped, forms[0]) {
		forms = append(forms, escaped)
	}
	return redactor{forms: forms}
}

func (r redactor) redact(b []byte) []byte {
	for _, f := range r.forms {
		b = bytes.ReplaceAll(b, f, []byte(redacted))
	}
	return b
}
