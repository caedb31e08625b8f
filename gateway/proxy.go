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

// MaxRequestBytes is the largest request body the gateway accepts; a larger
// one is refused with 413 and a JSON error before it is read.
const MaxRequestBytes = 16 << 20

// maxResponseBody bounds a whole (non-streamed) upstream answer.
const maxResponseBody = 64 << 20

// exchangeSeq numbers record lines across the process.
var exchangeSeq atomic.Int64

// routes is the gateway's surface: the OpenAI chat completions and
// Responses APIs, the Anthropic Messages API and the model list.
func (g *Gateway) routes() http.Handler {
	mux := http.NewServeMux()
	for _, api := range []*modelAPI{chatAPI, responsesAPI, messagesAPI} {
		mux.HandleFunc("POST "+api.path, func(w http.ResponseWriter, r *http.Request) { g.serveExchange(w, r, api) })
	}
	mux.HandleFunc("GET /v1/models", g.models)
	mux.HandleFunc("GET /v1/models/{id...}", g.model)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, shapeOf(r), http.StatusNotFound, codeNotFound, fmt.Sprintf("%s %s is not served: use %s, GET /v1/models or GET /v1/models/{id}", r.Method, r.URL.Path, g.servedPaths()))
	})
	return mux
}

// servedPaths names the model APIs this run's upstream speaks.
func (g *Gateway) servedPaths() string {
	var s string
	for i, api := range g.up.apis {
		if i > 0 {
			s += ", "
		}
		s += "POST " + api.path
	}
	return s
}

// modelObject describes the run's model in the fields both the OpenAI and
// the Anthropic model objects have.
func (g *Gateway) modelObject() map[string]any {
	return map[string]any{
		"id": g.up.publicName, "object": "model", "created": 0, "owned_by": "taskrun",
		"type": "model", "display_name": g.up.publicName, "created_at": "1970-01-01T00:00:00Z",
	}
}

// models lists the one model this run may use, as both APIs list models.
func (g *Gateway) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list", "data": []any{g.modelObject()},
		"has_more": false, "first_id": g.up.publicName, "last_id": g.up.publicName,
	})
}

// model describes the run's model, or answers 404 for any other id.
func (g *Gateway) model(w http.ResponseWriter, r *http.Request) {
	if id := r.PathValue("id"); id != g.up.publicName {
		writeError(w, shapeOf(r), http.StatusNotFound, codeNotFound, fmt.Sprintf("model %q is not served: this run's model is %q", id, g.up.publicName))
		return
	}
	writeJSON(w, http.StatusOK, g.modelObject())
}

// bodyReadTimeout bounds reading one request body.
const bodyReadTimeout = 2 * time.Minute

// serveExchange meters, forwards and records one model request.
//
// Exchanges run one at a time: a request arriving while another is in
// flight waits, before its body is read, until the other is metered (or its
// client goes away, RequestTimeout passes or the gateway closes). Before
// forwarding, the request's most possible cost is reserved against the
// token budget and its completion limit clamped to it. The upstream
// exchange is detached from the agent's connection: when the agent hangs
// up, the gateway reads the upstream answer to its end anyway so its usage
// is metered, and an answer without usage is charged an estimate.
func (g *Gateway) serveExchange(w http.ResponseWriter, r *http.Request, api *modelAPI) {
	start := time.Now()
	x := &exchange{Time: start.UTC(), Seq: exchangeSeq.Add(1), API: api.name, Path: r.URL.Path}
	defer func() {
		x.DurationMS = time.Since(start).Milliseconds()
		if err := g.trace.write(x); err != nil {
			g.log.Warn("write gateway record", "err", err)
		}
	}()
	if !g.up.speaks(api) {
		g.fail(w, api.shape, x, http.StatusNotFound, codeNotFound, fmt.Sprintf("this run's model %q does not speak the %s API: use %s", g.up.publicName, api.name, g.servedPaths()))
		return
	}
	if r.ContentLength > MaxRequestBytes {
		g.fail(w, api.shape, x, http.StatusRequestEntityTooLarge, codeTooLarge, tooLarge(r.ContentLength))
		return
	}
	release, err := g.acquire(r.Context())
	if err != nil {
		g.fail(w, api.shape, x, http.StatusServiceUnavailable, codeBusy, err.Error())
		return
	}
	defer release()
	body, err := readBody(w, r)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			g.fail(w, api.shape, x, http.StatusRequestEntityTooLarge, codeTooLarge, tooLarge(-1))
			return
		}
		g.fail(w, api.shape, x, http.StatusBadRequest, codeInvalidRequest, fmt.Sprintf("read request: %v", err))
		return
	}
	req, err := parseRequest(api, body)
	if err != nil {
		x.setRequest(body, "")
		g.fail(w, api.shape, x, http.StatusBadRequest, codeInvalidRequest, err.Error())
		return
	}
	x.Stream = req.stream
	if req.serverState && g.meter.hasTokenBudget() {
		x.setRequest(body, "")
		g.fail(w, api.shape, x, http.StatusBadRequest, codeInvalidRequest, "previous_response_id and conversation continue a prompt the gateway cannot see, so it cannot reserve its cost against the run's token budget: send the whole conversation in input")
		return
	}
	prompt := estimateTokens(body, len(g.up.model))
	limit, err := g.meter.admit(prompt)
	if err != nil {
		x.setRequest(body, omitBudget)
		g.log.Warn("model request refused", "err", err)
		// The budget will not come back: SDKs must not retry.
		w.Header().Set("x-should-retry", "false")
		g.fail(w, api.shape, x, http.StatusTooManyRequests, codeBudget, err.Error())
		return
	}
	x.setRequest(body, "")
	reserved := 0
	if limit > 0 {
		reserved = prompt + limit
	}
	upBody, err := req.upstreamBody(g.up.model, limit)
	if err != nil {
		g.meter.settle(reserved, nil)
		g.fail(w, api.shape, x, http.StatusBadRequest, codeInvalidRequest, err.Error())
		return
	}
	ctx, cancel := g.exchangeContext(r.Context())
	defer cancel()
	upStatus, usage := g.forward(ctx, w, r.Header, upBody, req, x)
	if usage == nil && (upStatus == http.StatusOK || ctx.Err() != nil) {
		usage = g.estimate(x, prompt, req.completionCap)
	}
	if usage != nil {
		x.Usage = usage
	}
	g.meter.settle(reserved, usage)
}

// tooLarge is the message for a request body over MaxRequestBytes.
func tooLarge(n int64) string {
	size := "the request body"
	if n >= 0 {
		size = fmt.Sprintf("the request body (%d bytes)", n)
	}
	return fmt.Sprintf("%s is over the gateway's limit of %d bytes (16 MiB): send a smaller request, e.g. fewer or smaller images or files", size, MaxRequestBytes)
}

// readBody reads a request body within MaxRequestBytes and bodyReadTimeout,
// then lifts the read deadline so a long streamed answer is not cut short.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
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

// forward sends the request upstream and relays the answer to the agent.
// It returns the upstream's status (0 if the upstream did not answer) and
// the usage the answer reported, if any. An upstream that is misconfigured
// or down is noted (see UpstreamErr) and the agent told so without where
// the upstream is.
func (g *Gateway) forward(ctx context.Context, w http.ResponseWriter, agent http.Header, upBody []byte, req *modelRequest, x *exchange) (int, *tokenUsage) {
	if deadline, ok := ctx.Deadline(); ok {
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(deadline)
		defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	}
	shape := req.api.shape
	resp, err := g.up.send(ctx, req.api, upBody, agent)
	if err != nil {
		if ctx.Err() == nil {
			g.upstreamFailed(unreachable(err), err)
		}
		g.fail(w, shape, x, http.StatusBadGateway, codeUpstream, "model upstream unreachable: the run's model is unavailable, retrying will not help; stop and report it")
		return 0, nil
	}
	defer resp.Body.Close()
	x.Status = resp.StatusCode
	if failure := upstreamFailure(resp.StatusCode); failure != nil {
		g.upstreamFailed(failure, nil)
		g.relayFailure(w, resp, shape, failure, x)
		return resp.StatusCode, nil
	}
	g.upstreamOK()
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if req.stream && resp.StatusCode == http.StatusOK && mediaType == "text/event-stream" {
		return resp.StatusCode, g.relayStream(w, resp.Body, req, x)
	}
	return resp.StatusCode, g.relayBody(w, resp, req.api, x)
}

// relayFailure records the upstream's error body and tells the agent the
// upstream failed, in its API's error shape, without the upstream's own
// words (which can name its address). A misconfigured upstream cannot be
// fixed by retrying, so SDKs are told not to.
func (g *Gateway) relayFailure(w http.ResponseWriter, resp *http.Response, shape errorShape, failure *UpstreamError, x *exchange) {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, MaxRecordedBodyBytes+1))
	x.setResponse(g.trace.redactor.redact(body))
	msg := failure.Error() + ": the run's model is unavailable"
	if failure.Misconfigured() {
		w.Header().Set("x-should-retry", "false")
		msg = failure.Error() + ": the run's model is misconfigured on the host; retrying will not help, stop and report it"
	}
	x.Status = http.StatusBadGateway
	x.Error = failure.Error()
	writeError(w, shape, http.StatusBadGateway, codeUpstream, msg)
}

// estimate charges an exchange that reached the upstream but reported no
// usage: its estimated prompt plus its completion limit, if any.
func (g *Gateway) estimate(x *exchange, prompt, completionCap int) *tokenUsage {
	x.UsageEstimated = true
	g.log.Warn("upstream reported no usage: charging an estimate", "seq", x.Seq, "prompt_tokens", prompt, "completion_tokens", completionCap)
	return &tokenUsage{PromptTokens: prompt, CompletionTokens: completionCap, TotalTokens: prompt + completionCap}
}

// relayBody passes a whole (non-streamed or error) response through and
// returns the usage it reports.
func (g *Gateway) relayBody(w http.ResponseWriter, resp *http.Response, api *modelAPI, x *exchange) *tokenUsage {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	if err != nil {
		g.fail(w, api.shape, x, http.StatusBadGateway, codeUpstream, fmt.Sprintf("read upstream response: %v", err))
		return nil
	}
	body = g.trace.redactor.redact(body)
	x.setResponse(body)
	if !json.Valid(body) {
		x.Error = fmt.Sprintf("upstream returned %d bytes of non-JSON", len(body))
	}
	var usage *tokenUsage
	if resp.StatusCode == http.StatusOK {
		var parsed map[string]json.RawMessage
		if json.Unmarshal(body, &parsed) == nil {
			if u, ok := api.parseUsage(parsed[api.usageKey]); ok {
				usage = &u
			}
		}
	}
	for _, h := range []string{"Content-Type", "Retry-After"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
	return usage
}

// relayStream passes a server-sent event stream through line by line and
// returns the usage its events report. For chat completions it removes
// the usage chunk the agent did not ask for.
func (g *Gateway) relayStream(w http.ResponseWriter, body io.Reader, req *modelRequest, x *exchange) *tokenUsage {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	rd := bufio.NewReaderSize(body, 64<<10)
	keepUsage := !req.api.streamUsageOption || req.includeUsage
	skipBlank := false
	var acc streamUsage
	agentGone := false
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 {
			out, drop := g.streamLine(line, req.api, keepUsage, &acc, x)
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
					// Keep reading: usage comes last.
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
	if u, ok := acc.final(); ok {
		return &u
	}
	return nil
}

// streamLine handles one SSE line: it returns the line to send (redacted)
// and whether to drop it, and accumulates the usage its event reports.
func (g *Gateway) streamLine(line []byte, api *modelAPI, keepUsage bool, acc *streamUsage, x *exchange) ([]byte, bool) {
	payload, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
	payload = bytes.TrimSpace(payload)
	if !ok || bytes.Equal(payload, []byte("[DONE]")) || !json.Valid(payload) {
		return g.trace.redactor.redact(line), false
	}
	x.addChunk(g.trace.redactor.redact(bytes.Clone(payload)))
	var event map[string]json.RawMessage
	if json.Unmarshal(payload, &event) != nil {
		return g.trace.redactor.redact(line), false
	}
	api.eventUsage(event, acc)
	rawUsage, hasUsage := event["usage"]
	if keepUsage || !hasUsage {
		return g.trace.redactor.redact(line), false
	}
	// A chat completion chunk with usage the agent did not ask for.
	if isNull(rawUsage) {
		delete(event, "usage")
	} else {
		var choices []json.RawMessage
		if json.Unmarshal(event["choices"], &choices) == nil && len(choices) == 0 {
			return nil, true
		}
		delete(event, "usage")
	}
	stripped, err := json.Marshal(event)
	if err != nil {
		return g.trace.redactor.redact(line), false
	}
	return g.trace.redactor.redact(append(append([]byte("data: "), stripped...), '\n')), false
}

// fail answers with an error in the API's shape and notes it in the record.
func (g *Gateway) fail(w http.ResponseWriter, shape errorShape, x *exchange, status int, code, msg string) {
	msg = string(g.trace.redactor.redact([]byte(msg)))
	x.Status = status
	x.Error = msg
	writeError(w, shape, status, code, msg)
}
