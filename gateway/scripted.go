package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

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

// ScriptUsage is the token usage a scripted response reports, in each
// API's own usage fields.
type ScriptUsage struct {
	// PromptTokens counts every input token, cached or not.
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// CacheReadTokens are the prompt tokens reported as read from the cache.
	CacheReadTokens int `json:"cache_read_tokens,omitempty"`
	// CacheWriteTokens are the prompt tokens reported as written to the
	// cache (Anthropic's cache_creation_input_tokens).
	CacheWriteTokens int `json:"cache_write_tokens,omitempty"`
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
	u := l.Usage
	if u.PromptTokens < 0 || u.CompletionTokens < 0 || u.CacheReadTokens < 0 || u.CacheWriteTokens < 0 {
		return fmt.Errorf("%w: script line %d has negative usage", ErrBadConfig, n)
	}
	if u.CacheReadTokens+u.CacheWriteTokens > u.PromptTokens {
		return fmt.Errorf("%w: script line %d: cache tokens are part of prompt_tokens and cannot exceed it", ErrBadConfig, n)
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
