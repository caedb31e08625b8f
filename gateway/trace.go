package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
	"time"
)

// redacted replaces secrets in traces and in bodies relayed to the agent.
const redacted = "[REDACTED]"

// exchange is one trace line: a request from the agent and what came of it.
type exchange struct {
	Time       time.Time   `json:"ts"`
	Seq        int64       `json:"seq"`
	Path       string      `json:"path"`
	Stream     bool        `json:"stream"`
	Status     int         `json:"status"`
	DurationMS int64       `json:"duration_ms"`
	Usage      *tokenUsage `json:"usage,omitempty"`
	// UsageEstimated is true when the upstream reported no usage and Usage is the gateway's estimate.
	UsageEstimated bool              `json:"usage_estimated,omitempty"`
	Request        json.RawMessage   `json:"request,omitempty"`
	Response       json.RawMessage   `json:"response,omitempty"`
	Chunks         []json.RawMessage `json:"chunks,omitempty"`
	Error          string            `json:"error,omitempty"`
}

// maxTracedChunks bounds the stream chunks one trace line keeps.
const maxTracedChunks = 4096

// traceWriter appends exchanges as JSON lines, redacting the key.
type traceWriter struct {
	mu       sync.Mutex
	w        io.Writer
	redactor redactor
}

func newTraceWriter(w io.Writer, key string) *traceWriter {
	return &traceWriter{w: w, redactor: newRedactor(key)}
}

// write appends one exchange; trace failures never fail the exchange.
func (t *traceWriter) write(x *exchange) error {
	if t.w == nil {
		return nil
	}
	line, err := json.Marshal(x)
	if err != nil {
		return err
	}
	line = append(t.redactor.redact(line), '\n')
	t.mu.Lock()
	defer t.mu.Unlock()
	_, err = t.w.Write(line)
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
