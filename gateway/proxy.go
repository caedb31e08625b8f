package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync/atomic"
	"time"
)

// Size limits for bodies passing through the gateway.
const (
	maxRequestBody  = 16 << 20
	maxResponseBody = 64 << 20
)

// exchangeSeq numbers trace lines across the process.
var exchangeSeq atomic.Int64

// tokenUsage is the usage object of a chat completion.
type tokenUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// routes is the gateway's OpenAI-compatible surface.
func (g *Gateway) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", g.chatCompletions)
	mux.HandleFunc("GET /v1/models", g.models)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("%s %s is not served: use POST /v1/chat/completions or GET /v1/models", r.Method, r.URL.Path))
	})
	return mux
}

// models lists the one model this run may use.
func (g *Gateway) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": g.up.publicName, "object": "model", "created": 0, "owned_by": "taskrun",
		}},
	})
}

// chatRequest is the part of a chat completions request the scripted
// upstream reads.
type chatRequest struct {
	Stream        bool `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// bodyReadTimeout bounds reading one request body.
const bodyReadTimeout = 2 * time.Minute

// chatCompletions meters, forwards and traces one chat completion.
//
// Exchanges run one at a time: a request arriving while another is in
// flight waits, before its body is read, until the other is metered (or its
// client goes away, RequestTimeout passes or the gateway closes). The
// upstream exchange is detached from the agent's connection: when the agent
// hangs up, the gateway reads the upstream answer to its end anyway so its
// usage is metered, and an answer without usage is charged an estimate.
func (g *Gateway) chatCompletions(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	x := &exchange{Time: start.UTC(), Seq: exchangeSeq.Add(1), Path: r.URL.Path}
	defer func() {
		x.DurationMS = time.Since(start).Milliseconds()
		if err := g.trace.write(x); err != nil {
			g.log.Warn("write gateway trace", "err", err)
		}
	}()
	release, err := g.acquire(r.Context())
	if err != nil {
		g.fail(w, x, http.StatusServiceUnavailable, "gateway_busy", err.Error())
		return
	}
	defer release()
	body, err := readBody(w, r)
	if err != nil {
		g.fail(w, x, http.StatusRequestEntityTooLarge, "invalid_request_error", fmt.Sprintf("read request: %v", err))
		return
	}
	x.Request = json.RawMessage(body)
	req, err := parseChatBody(body)
	if err != nil {
		x.Request = nil
		g.fail(w, x, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	x.Stream = req.stream
	if err := g.meter.admit(); err != nil {
		g.log.Warn("model request refused", "err", err)
		g.fail(w, x, http.StatusTooManyRequests, "budget_exceeded", err.Error())
		return
	}
	upBody, err := req.upstreamBody(g.up.model, g.meter.remainingTokens())
	if err != nil {
		g.fail(w, x, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	ctx, cancel := g.exchangeContext(r.Context())
	defer cancel()
	upStatus := g.forward(ctx, w, upBody, req, x)
	if x.Usage == nil && (upStatus == http.StatusOK || ctx.Err() != nil) {
		g.estimate(x, len(body), req.completionCap)
	}
}

// readBody reads a request body within maxRequestBody and bodyReadTimeout,
// then lifts the read deadline so a long streamed answer is not cut short.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	_ = rc.SetReadDeadline(time.Time{})
	return body, err
}

// exchangeContext is the context of one upstream exchange: it keeps the
// request's values but not its cancellation, ends after RequestTimeout and
// is cancelled when Close gives up waiting.
func (g *Gateway) exchangeContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), g.cfg.RequestTimeout)
	stop := context.AfterFunc(g.abortCtx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// forward sends the request upstream and relays the answer to the agent,
// metering the usage it reports. It returns the upstream's status, 0 if the
// upstream did not answer.
func (g *Gateway) forward(ctx context.Context, w http.ResponseWriter, upBody []byte, req *chatBody, x *exchange) int {
	if deadline, ok := ctx.Deadline(); ok {
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(deadline)
		defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	}
	resp, err := g.up.send(ctx, upBody)
	if err != nil {
		g.fail(w, x, http.StatusBadGateway, "upstream_error", err.Error())
		return 0
	}
	defer resp.Body.Close()
	x.Status = resp.StatusCode
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if req.stream && resp.StatusCode == http.StatusOK && mediaType == "text/event-stream" {
		g.relayStream(w, resp.Body, req.includeUsage, x)
		return resp.StatusCode
	}
	g.relayBody(w, resp, x)
	return resp.StatusCode
}

// estimate charges an exchange that reached the upstream but reported no
// usage: a token per 4 request bytes plus the completion limit, if any.
func (g *Gateway) estimate(x *exchange, requestBytes, completionCap int) {
	x.UsageEstimated = true
	g.log.Warn("upstream reported no usage: charging an estimate", "seq", x.Seq, "prompt_tokens", requestBytes/4, "completion_tokens", completionCap)
	g.record(x, tokenUsage{PromptTokens: requestBytes / 4, CompletionTokens: completionCap, TotalTokens: requestBytes/4 + completionCap})
}

// relayBody passes a whole (non-streamed or error) response through,
// metering its usage.
func (g *Gateway) relayBody(w http.ResponseWriter, resp *http.Response, x *exchange) {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	if err != nil {
		g.fail(w, x, http.StatusBadGateway, "upstream_error", fmt.Sprintf("read upstream response: %v", err))
		return
	}
	body = g.trace.redactor.redact(body)
	if json.Valid(body) {
		x.Response = json.RawMessage(body)
	} else {
		x.Error = fmt.Sprintf("upstream returned %d bytes of non-JSON", len(body))
	}
	if resp.StatusCode == http.StatusOK {
		var parsed struct {
			Usage *tokenUsage `json:"usage"`
		}
		if json.Unmarshal(body, &parsed) == nil && parsed.Usage != nil {
			g.record(x, *parsed.Usage)
		}
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
}

// relayStream passes a server-sent event stream through event by event,
// metering the usage chunk and removing usage the agent did not ask for.
func (g *Gateway) relayStream(w http.ResponseWriter, body io.Reader, keepUsage bool, x *exchange) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	rd := bufio.NewReaderSize(body, 64<<10)
	skipBlank := false
	var usage *tokenUsage
	agentGone := false
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 {
			out, drop, u := g.streamLine(line, keepUsage, x)
			if u != nil {
				usage = u
			}
			switch {
			case drop:
				skipBlank = true
			case skipBlank && len(bytes.TrimSpace(out)) == 0:
				skipBlank = false
			default:
				skipBlank = false
				if agentGone {
					break
				}
				if _, werr := w.Write(out); werr != nil {
					// Keep reading: the usage chunk comes last.
					x.Error = fmt.Sprintf("write to agent: %v", werr)
					agentGone = true
					break
				}
				if flusher != nil {
					flusher.Flush()
				}
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				x.Error = fmt.Sprintf("read upstream stream: %v", err)
			}
			break
		}
	}
	if usage != nil {
		g.record(x, *usage)
	}
}

// streamLine handles one SSE line: it returns the line to send (redacted),
// whether to drop it, and the usage it carried, if any.
func (g *Gateway) streamLine(line []byte, keepUsage bool, x *exchange) ([]byte, bool, *tokenUsage) {
	payload, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
	payload = bytes.TrimSpace(payload)
	if !ok || bytes.Equal(payload, []byte("[DONE]")) || !json.Valid(payload) {
		return g.trace.redactor.redact(line), false, nil
	}
	if len(x.Chunks) < maxTracedChunks {
		x.Chunks = append(x.Chunks, json.RawMessage(g.trace.redactor.redact(bytes.Clone(payload))))
	}
	var chunk map[string]json.RawMessage
	if json.Unmarshal(payload, &chunk) != nil {
		return g.trace.redactor.redact(line), false, nil
	}
	rawUsage, hasUsage := chunk["usage"]
	var usage *tokenUsage
	if hasUsage && string(rawUsage) != "null" {
		var u tokenUsage
		if json.Unmarshal(rawUsage, &u) == nil {
			usage = &u
		}
	}
	if keepUsage || !hasUsage {
		return g.trace.redactor.redact(line), false, usage
	}
	var choices []json.RawMessage
	if json.Unmarshal(chunk["choices"], &choices) == nil && len(choices) == 0 {
		return nil, true, usage
	}
	delete(chunk, "usage")
	stripped, err := json.Marshal(chunk)
	if err != nil {
		return g.trace.redactor.redact(line), false, usage
	}
	return g.trace.redactor.redact(append(append([]byte("data: "), stripped...), '\n')), false, usage
}

// record meters an exchange's usage and notes it in the trace.
func (g *Gateway) record(x *exchange, u tokenUsage) {
	x.Usage = &u
	g.meter.add(u.PromptTokens, u.CompletionTokens)
}

// fail answers with an OpenAI-style error and notes it in the trace.
func (g *Gateway) fail(w http.ResponseWriter, x *exchange, status int, kind, msg string) {
	msg = string(g.trace.redactor.redact([]byte(msg)))
	x.Status = status
	x.Error = msg
	writeError(w, status, kind, msg)
}

// writeError writes an OpenAI-style error body.
func writeError(w http.ResponseWriter, status int, kind, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": kind, "code": kind}})
}

// writeJSON writes v as a JSON response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
