package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// scriptTransport is an http.RoundTripper that answers each model API from
// a script, one line per request, so the gateway meters and records
// scripted runs exactly as it does real ones.
type scriptTransport struct {
	mu    sync.Mutex
	lines []ScriptLine
	next  int
}

// scriptedRequest is the part of a request the scripted upstream reads.
type scriptedRequest struct {
	Stream        bool `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// RoundTrip replays the next scripted response in the shape of the API the
// request's path names.
func (s *scriptTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("read scripted request: %w", err)
	}
	var api *modelAPI
	for _, a := range []*modelAPI{chatAPI, responsesAPI, messagesAPI} {
		if strings.HasSuffix(req.URL.Path, a.upstreamPath) {
			api = a
		}
	}
	if api == nil {
		return jsonResponse(req, http.StatusNotFound, errorBody(shapeOpenAI, http.StatusNotFound, codeNotFound, "scripted provider: unknown path "+req.URL.Path)), nil
	}
	var sr scriptedRequest
	if err := json.Unmarshal(body, &sr); err != nil {
		return jsonResponse(req, http.StatusBadRequest, errorBody(api.shape, http.StatusBadRequest, codeInvalidRequest, err.Error())), nil
	}
	s.mu.Lock()
	n := s.next
	if n < len(s.lines) {
		s.next++
	}
	s.mu.Unlock()
	if n >= len(s.lines) {
		msg := fmt.Sprintf("script exhausted: all %d responses were replayed; add lines to the script", len(s.lines))
		return jsonResponse(req, http.StatusConflict, errorBody(api.shape, http.StatusConflict, "script_exhausted", msg)), nil
	}
	l := s.lines[n]
	r := scriptReply{line: l, n: n + 1, created: time.Now().Unix()}
	if !sr.Stream {
		switch api {
		case responsesAPI:
			return jsonResponse(req, http.StatusOK, r.response("completed")), nil
		case messagesAPI:
			return jsonResponse(req, http.StatusOK, r.message()), nil
		default:
			return jsonResponse(req, http.StatusOK, r.completion()), nil
		}
	}
	pr, pw := io.Pipe()
	w := &sseWriter{w: pw, req: req, delay: time.Duration(l.ChunkDelayMS) * time.Millisecond, ok: true}
	go func() {
		switch api {
		case responsesAPI:
			r.streamResponse(w)
		case messagesAPI:
			r.streamMessage(w)
		default:
			r.streamCompletion(w, sr.StreamOptions != nil && sr.StreamOptions.IncludeUsage)
		}
		pw.Close()
	}()
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": []string{"text/event-stream"}},
		Body:       pr,
		Request:    req,
	}, nil
}

// sseWriter writes server-sent events, pacing them, until a write fails or
// the request is cancelled.
type sseWriter struct {
	w     io.Writer
	req   *http.Request
	delay time.Duration
	ok    bool
}

// send writes one event (named, unless name is empty) whose data is v.
func (s *sseWriter) send(name string, v any) {
	if !s.ok {
		return
	}
	data, _ := json.Marshal(v)
	prefix := ""
	if name != "" {
		prefix = "event: " + name + "\n"
	}
	if _, err := fmt.Fprintf(s.w, "%sdata: %s\n\n", prefix, data); err != nil {
		s.ok = false
		return
	}
	if s.delay > 0 {
		select {
		case <-s.req.Context().Done():
			s.ok = false
		case <-time.After(s.delay):
		}
	}
}

// scriptReply renders one script line in each API's shape.
type scriptReply struct {
	line    ScriptLine
	n       int
	created int64
}

// completion is a non-streamed chat completion.
func (r scriptReply) completion() map[string]any {
	l := r.line
	msg := map[string]any{"role": "assistant", "content": l.Content}
	if len(l.ToolCalls) > 0 {
		calls := make([]map[string]any, len(l.ToolCalls))
		for i, tc := range l.ToolCalls {
			calls[i] = map[string]any{"id": tc.ID, "type": "function", "function": map[string]any{"name": tc.Name, "arguments": string(tc.Arguments)}}
		}
		msg["tool_calls"] = calls
	}
	return map[string]any{
		"id": r.chatID(), "object": "chat.completion", "created": r.created, "model": scriptedModelName,
		"choices": []map[string]any{{"index": 0, "message": msg, "finish_reason": r.finishReason()}},
		"usage":   r.chatUsage(),
	}
}

func (r scriptReply) chatID() string { return fmt.Sprintf("chatcmpl-scripted-%d", r.n) }

func (r scriptReply) finishReason() string {
	if len(r.line.ToolCalls) > 0 {
		return "tool_calls"
	}
	return "stop"
}

func (r scriptReply) chatUsage() map[string]any {
	u := r.line.Usage
	out := map[string]any{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens, "total_tokens": u.PromptTokens + u.CompletionTokens}
	if u.CacheReadTokens > 0 {
		out["prompt_tokens_details"] = map[string]int{"cached_tokens": u.CacheReadTokens}
	}
	return out
}

// streamCompletion writes chat completion chunks the way the OpenAI API
// streams: text in pieces, tool call arguments in two halves, a finish
// chunk, then (when asked) a usage chunk with no choices.
func (r scriptReply) streamCompletion(w *sseWriter, includeUsage bool) {
	l := r.line
	send := func(choice map[string]any, usage any) {
		chunk := map[string]any{"id": r.chatID(), "object": "chat.completion.chunk", "created": r.created, "model": scriptedModelName, "choices": []any{}}
		if choice != nil {
			chunk["choices"] = []any{choice}
		}
		if includeUsage {
			chunk["usage"] = usage
		}
		w.send("", chunk)
	}
	send(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil}, nil)
	for _, piece := range splitWords(l.Content) {
		send(map[string]any{"index": 0, "delta": map[string]any{"content": piece}, "finish_reason": nil}, nil)
	}
	for i, tc := range l.ToolCalls {
		first, rest := halves(tc.Arguments)
		send(map[string]any{"index": 0, "delta": map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": tc.ID, "type": "function", "function": map[string]any{"name": tc.Name, "arguments": first}}}}, "finish_reason": nil}, nil)
		send(map[string]any{"index": 0, "delta": map[string]any{"tool_calls": []any{map[string]any{"index": i, "function": map[string]any{"arguments": rest}}}}, "finish_reason": nil}, nil)
	}
	send(map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": r.finishReason()}, nil)
	if includeUsage {
		send(nil, r.chatUsage())
	}
	if w.ok {
		_, _ = io.WriteString(w.w, "data: [DONE]\n\n")
	}
}

// halves cuts a tool call's arguments in two, as streams deliver them.
func halves(args json.RawMessage) (string, string) {
	half := len(args) / 2
	return string(args[:half]), string(args[half:])
}

// responseItems are the output items of a Responses API answer.
func (r scriptReply) responseItems() []map[string]any {
	var items []map[string]any
	if r.line.Content != "" {
		items = append(items, map[string]any{
			"type": "message", "id": fmt.Sprintf("msg_scripted_%d", r.n), "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": r.line.Content, "annotations": []any{}}},
		})
	}
	for i, tc := range r.line.ToolCalls {
		items = append(items, map[string]any{
			"type": "function_call", "id": fmt.Sprintf("fc_scripted_%d_%d", r.n, i), "call_id": tc.ID,
			"name": tc.Name, "arguments": string(tc.Arguments), "status": "completed",
		})
	}
	return items
}

// response is a Responses API answer with the given status; only a
// finished one carries usage.
func (r scriptReply) response(status string) map[string]any {
	u := r.line.Usage
	resp := map[string]any{
		"id": fmt.Sprintf("resp_scripted_%d", r.n), "object": "response", "created_at": r.created,
		"status": status, "model": scriptedModelName, "output": []any{}, "parallel_tool_calls": true,
		"tool_choice": "auto", "tools": []any{}, "usage": nil,
	}
	if status == "completed" {
		resp["output"] = r.responseItems()
		resp["usage"] = map[string]any{
			"input_tokens": u.PromptTokens, "input_tokens_details": map[string]int{"cached_tokens": u.CacheReadTokens},
			"output_tokens": u.CompletionTokens, "output_tokens_details": map[string]int{"reasoning_tokens": 0},
			"total_tokens": u.PromptTokens + u.CompletionTokens,
		}
	}
	return resp
}

// streamResponse writes the Responses API's event stream: created, each
// output item added, its deltas and done events, then completed with usage.
func (r scriptReply) streamResponse(w *sseWriter) {
	seq := 0
	send := func(typ string, fields map[string]any) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		w.send(typ, fields)
	}
	send("response.created", map[string]any{"response": r.response("in_progress")})
	send("response.in_progress", map[string]any{"response": r.response("in_progress")})
	for i, item := range r.responseItems() {
		id := item["id"]
		switch item["type"] {
		case "message":
			send("response.output_item.added", map[string]any{"output_index": i, "item": map[string]any{"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []any{}}})
			send("response.content_part.added", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
			for _, piece := range splitWords(r.line.Content) {
				send("response.output_text.delta", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "delta": piece, "logprobs": []any{}})
			}
			send("response.output_text.done", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "text": r.line.Content, "logprobs": []any{}})
			send("response.content_part.done", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "part": item["content"].([]any)[0]})
		case "function_call":
			added := map[string]any{}
			for k, v := range item {
				added[k] = v
			}
			added["arguments"], added["status"] = "", "in_progress"
			send("response.output_item.added", map[string]any{"output_index": i, "item": added})
			first, rest := halves(json.RawMessage(item["arguments"].(string)))
			for _, d := range []string{first, rest} {
				send("response.function_call_arguments.delta", map[string]any{"item_id": id, "output_index": i, "delta": d})
			}
			send("response.function_call_arguments.done", map[string]any{"item_id": id, "output_index": i, "name": item["name"], "arguments": item["arguments"]})
		}
		send("response.output_item.done", map[string]any{"output_index": i, "item": item})
	}
	send("response.completed", map[string]any{"response": r.response("completed")})
}

// anthropicUsage is the Messages API usage: input_tokens excludes the cache.
func (r scriptReply) anthropicUsage(output int) map[string]any {
	u := r.line.Usage
	return map[string]any{
		"input_tokens":                u.PromptTokens - u.CacheReadTokens - u.CacheWriteTokens,
		"cache_creation_input_tokens": u.CacheWriteTokens,
		"cache_read_input_tokens":     u.CacheReadTokens,
		"output_tokens":               output,
	}
}

// messageBlocks are the content blocks of a Messages API answer.
func (r scriptReply) messageBlocks() []map[string]any {
	var blocks []map[string]any
	if r.line.Content != "" {
		blocks = append(blocks, map[string]any{"type": "text", "text": r.line.Content})
	}
	for _, tc := range r.line.ToolCalls {
		blocks = append(blocks, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Name, "input": tc.Arguments})
	}
	return blocks
}

func (r scriptReply) stopReason() string {
	if len(r.line.ToolCalls) > 0 {
		return "tool_use"
	}
	return "end_turn"
}

// message is a non-streamed Messages API answer.
func (r scriptReply) message() map[string]any {
	return map[string]any{
		"id": fmt.Sprintf("msg_scripted_%d", r.n), "type": "message", "role": "assistant", "model": scriptedModelName,
		"content": r.messageBlocks(), "stop_reason": r.stopReason(), "stop_sequence": nil,
		"usage": r.anthropicUsage(r.line.Usage.CompletionTokens),
	}
}

// streamMessage writes the Messages API's event stream: message_start
// with the input usage, each content block's start, deltas and stop,
// message_delta with the output usage, message_stop.
func (r scriptReply) streamMessage(w *sseWriter) {
	start := r.message()
	start["content"], start["stop_reason"], start["usage"] = []any{}, nil, r.anthropicUsage(1)
	w.send("message_start", map[string]any{"type": "message_start", "message": start})
	for i, block := range r.messageBlocks() {
		switch block["type"] {
		case "text":
			w.send("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "text", "text": ""}})
			for _, piece := range splitWords(r.line.Content) {
				w.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": piece}})
			}
		case "tool_use":
			w.send("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "tool_use", "id": block["id"], "name": block["name"], "input": map[string]any{}}})
			first, rest := halves(block["input"].(json.RawMessage))
			for _, d := range []string{first, rest} {
				w.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": d}})
			}
		}
		w.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	w.send("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": r.stopReason(), "stop_sequence": nil}, "usage": map[string]any{"output_tokens": r.line.Usage.CompletionTokens}})
	w.send("message_stop", map[string]any{"type": "message_stop"})
}

// splitWords cuts text into word-sized pieces that join back to text.
func splitWords(text string) []string {
	var pieces []string
	for text != "" {
		i := strings.IndexAny(text[1:], " \n")
		if i < 0 {
			pieces = append(pieces, text)
			break
		}
		pieces = append(pieces, text[:i+1])
		text = text[i+1:]
	}
	return pieces
}

// jsonResponse is an in-process JSON HTTP response.
func jsonResponse(req *http.Request, status int, v any) *http.Response {
	data, _ := json.Marshal(v)
	return &http.Response{
		StatusCode:    status,
		Header:        http.Header{"Content-Type": []string{"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(data)),
		ContentLength: int64(len(data)),
		Request:       req,
	}
}
