package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/taskrun/taskrun/examples"
)

// DemoScriptName is the scripted model name that selects the built-in demo
// script (examples/demo/script.jsonl, embedded), so a demo needs no file path.
const DemoScriptName = "builtin:demo"

// ScriptLine is one scripted model response: a line of a JSONL script.
type ScriptLine struct {
	// Note is a comment for the script's reader; it is never sent.
	Note string `json:"note,omitempty"`
	// Content is the assistant's text.
	Content string `json:"content,omitempty"`
	// ToolCalls are the tools the assistant calls.
	ToolCalls []ScriptToolCall `json:"tool_calls,omitempty"`
	// Usage is reported to the gateway's meter exactly as written.
	Usage ScriptUsage `json:"usage"`
	// ChunkDelayMS paces a streamed response: the pause between chunks.
	ChunkDelayMS int `json:"chunk_delay_ms,omitempty"`
}

// ScriptToolCall is one tool call of a scripted response.
type ScriptToolCall struct {
	// ID is the call's id; empty gets a generated one.
	ID string `json:"id,omitempty"`
	// Name is the tool's name.
	Name string `json:"name"`
	// Arguments is the JSON object of arguments.
	Arguments json.RawMessage `json:"arguments"`
}

// ScriptUsage is the token usage a scripted response reports.
type ScriptUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// ParseScript reads a JSONL script, one response per non-blank line.
func ParseScript(r io.Reader) ([]ScriptLine, error) {
	var lines []ScriptLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for n := 1; sc.Scan(); n++ {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var l ScriptLine
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return nil, fmt.Errorf("%w: script line %d: %w", ErrBadConfig, n, err)
		}
		if err := l.check(n); err != nil {
			return nil, err
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read script: %w", err)
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("%w: script has no responses: add one JSON object per line", ErrBadConfig)
	}
	return lines, nil
}

// check validates a line and fills in generated tool call ids.
func (l *ScriptLine) check(n int) error {
	if l.Content == "" && len(l.ToolCalls) == 0 {
		return fmt.Errorf("%w: script line %d has neither content nor tool_calls", ErrBadConfig, n)
	}
	if l.Usage.PromptTokens < 0 || l.Usage.CompletionTokens < 0 {
		return fmt.Errorf("%w: script line %d has negative usage", ErrBadConfig, n)
	}
	for i := range l.ToolCalls {
		tc := &l.ToolCalls[i]
		if tc.Name == "" {
			return fmt.Errorf("%w: script line %d tool call %d has no name", ErrBadConfig, n, i)
		}
		var args map[string]any
		if err := json.Unmarshal(tc.Arguments, &args); err != nil || args == nil {
			return fmt.Errorf("%w: script line %d tool call %s: arguments must be a JSON object", ErrBadConfig, n, tc.Name)
		}
		compact := new(bytes.Buffer)
		_ = json.Compact(compact, tc.Arguments)
		tc.Arguments = compact.Bytes()
		if tc.ID == "" {
			tc.ID = fmt.Sprintf("call_%d_%d", n, i)
		}
	}
	return nil
}

// loadScript reads the script the model name points at.
func loadScript(name string) (*scriptTransport, error) {
	var data []byte
	switch name {
	case "":
		return nil, fmt.Errorf("%w: scripted model needs a script: set name to a JSONL file or %q", ErrBadConfig, DemoScriptName)
	case DemoScriptName:
		data = examples.DemoScript
	default:
		var err error
		if data, err = os.ReadFile(name); err != nil {
			return nil, fmt.Errorf("%w: read script: %w", ErrBadConfig, err)
		}
	}
	lines, err := ParseScript(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	return &scriptTransport{lines: lines}, nil
}

// scriptTransport is an http.RoundTripper that answers chat completions from
// a script, one line per request, so the gateway meters and traces scripted
// runs exactly as it does real ones.
type scriptTransport struct {
	mu    sync.Mutex
	lines []ScriptLine
	next  int
}

// RoundTrip replays the next scripted response.
func (s *scriptTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("read scripted request: %w", err)
	}
	var cr chatRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		return jsonResponse(req, http.StatusBadRequest, map[string]any{"error": map[string]any{"message": err.Error(), "type": "invalid_request_error"}}), nil
	}
	s.mu.Lock()
	n := s.next
	if n < len(s.lines) {
		s.next++
	}
	s.mu.Unlock()
	if n >= len(s.lines) {
		msg := fmt.Sprintf("script exhausted: all %d responses were replayed; add lines to the script", len(s.lines))
		return jsonResponse(req, http.StatusConflict, map[string]any{"error": map[string]any{"message": msg, "type": "script_exhausted"}}), nil
	}
	l := s.lines[n]
	id := fmt.Sprintf("chatcmpl-scripted-%d", n+1)
	if !cr.Stream {
		return jsonResponse(req, http.StatusOK, completion(id, l)), nil
	}
	includeUsage := cr.StreamOptions != nil && cr.StreamOptions.IncludeUsage
	pr, pw := io.Pipe()
	go writeStream(req, pw, id, l, includeUsage)
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": []string{"text/event-stream"}},
		Body:       pr,
		Request:    req,
	}, nil
}

// completion is a non-streamed chat completion for a script line.
func completion(id string, l ScriptLine) map[string]any {
	msg := map[string]any{"role": "assistant", "content": l.Content}
	if len(l.ToolCalls) > 0 {
		calls := make([]map[string]any, len(l.ToolCalls))
		for i, tc := range l.ToolCalls {
			calls[i] = map[string]any{"id": tc.ID, "type": "function", "function": map[string]any{"name": tc.Name, "arguments": string(tc.Arguments)}}
		}
		msg["tool_calls"] = calls
	}
	return map[string]any{
		"id": id, "object": "chat.completion", "created": time.Now().Unix(), "model": scriptedModelName,
		"choices": []map[string]any{{"index": 0, "message": msg, "finish_reason": finishReason(l)}},
		"usage":   usageObject(l.Usage),
	}
}

func finishReason(l ScriptLine) string {
	if len(l.ToolCalls) > 0 {
		return "tool_calls"
	}
	return "stop"
}

func usageObject(u ScriptUsage) map[string]int {
	return map[string]int{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens, "total_tokens": u.PromptTokens + u.CompletionTokens}
}

// writeStream writes a script line as chat completion chunks, the way the
// OpenAI API streams: text in pieces, tool call arguments in two halves, a
// finish chunk, then (when asked) a usage chunk with no choices.
func writeStream(req *http.Request, pw *io.PipeWriter, id string, l ScriptLine, includeUsage bool) {
	delay := time.Duration(l.ChunkDelayMS) * time.Millisecond
	send := func(choice map[string]any, usage any) bool {
		chunk := map[string]any{"id": id, "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": scriptedModelName, "choices": []any{}}
		if choice != nil {
			chunk["choices"] = []any{choice}
		}
		if includeUsage {
			chunk["usage"] = usage
		}
		data, _ := json.Marshal(chunk)
		if _, err := fmt.Fprintf(pw, "data: %s\n\n", data); err != nil {
			return false
		}
		if delay > 0 {
			select {
			case <-req.Context().Done():
				return false
			case <-time.After(delay):
			}
		}
		return true
	}
	ok := send(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil}, nil)
	for _, piece := range splitWords(l.Content) {
		ok = ok && send(map[string]any{"index": 0, "delta": map[string]any{"content": piece}, "finish_reason": nil}, nil)
	}
	for i, tc := range l.ToolCalls {
		half := len(tc.Arguments) / 2
		first := map[string]any{"index": i, "id": tc.ID, "type": "function", "function": map[string]any{"name": tc.Name, "arguments": string(tc.Arguments[:half])}}
		rest := map[string]any{"index": i, "function": map[string]any{"arguments": string(tc.Arguments[half:])}}
		ok = ok && send(map[string]any{"index": 0, "delta": map[string]any{"tool_calls": []any{first}}, "finish_reason": nil}, nil)
		ok = ok && send(map[string]any{"index": 0, "delta": map[string]any{"tool_calls": []any{rest}}, "finish_reason": nil}, nil)
	}
	ok = ok && send(map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": finishReason(l)}, nil)
	if ok && includeUsage {
		ok = send(nil, usageObject(l.Usage))
	}
	if ok {
		_, _ = io.WriteString(pw, "data: [DONE]\n\n")
	}
	pw.Close()
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
