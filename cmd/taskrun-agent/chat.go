package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
)

// errModelRefused is returned when the gateway refuses a request (for
// example because the run's budget is spent).
var errModelRefused = errors.New("model request refused")

// message is one chat message (OpenAI format).
type message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// toolCall is a tool call the assistant made.
type toolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function functionCall `json:"function"`
}

type functionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// usage is the token usage the gateway reports.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// chatClient speaks chat completions to the gateway over its unix socket.
type chatClient struct {
	http  *http.Client
	model string
}

// gatewayURL is the base URL used over the socket; the host part is ignored.
const gatewayURL = "http://gateway/v1"

func newChatClient(socket, model string) *chatClient {
	dialer := &net.Dialer{}
	return &chatClient{
		model: model,
		http: &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, "unix", socket)
			},
		}},
	}
}

// streamChunk is the part of a chat completion chunk the agent reads.
type streamChunk struct {
	Choices []struct {
		Delta struct {
			Content   string `json:"content"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// complete sends the conversation and streams the reply: assistant text is
// written to out as it arrives; tool calls are assembled from their deltas.
func (c *chatClient) complete(ctx context.Context, msgs []message, tools []toolSpec, out io.Writer) (message, usage, error) {
	body, err := json.Marshal(map[string]any{
		"model": c.model, "messages": msgs, "tools": tools, "stream": true,
		"stream_options": map[string]any{"include_usage": true},
	})
	if err != nil {
		return message{}, usage{}, fmt.Errorf("encode chat request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return message{}, usage{}, fmt.Errorf("build chat request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return message{}, usage{}, fmt.Errorf("model gateway: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return message{}, usage{}, gatewayError(resp)
	}
	return readStream(resp.Body, out)
}

// gatewayError turns a non-200 answer into an error carrying its message.
func gatewayError(resp *http.Response) error {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	msg := strings.TrimSpace(string(data))
	if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		return fmt.Errorf("%w (HTTP %d): %s", errModelRefused, resp.StatusCode, msg)
	}
	return fmt.Errorf("model gateway answered HTTP %d: %s", resp.StatusCode, msg)
}

// readStream assembles an assistant message from server-sent chunks.
func readStream(r io.Reader, out io.Writer) (message, usage, error) {
	msg := message{Role: "assistant"}
	var u usage
	var content strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		payload, ok := strings.CutPrefix(sc.Text(), "data:")
		payload = strings.TrimSpace(payload)
		if !ok || payload == "" {
			continue
		}
		if payload == "[DONE]" {
			break
		}
		var chunk streamChunk
		if err := json.Unmarshal([]byte(payload), &chunk); err != nil {
			return msg, u, fmt.Errorf("parse stream chunk: %w", err)
		}
		if chunk.Usage != nil {
			u = *chunk.Usage
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content != "" {
				content.WriteString(ch.Delta.Content)
				_, _ = io.WriteString(out, ch.Delta.Content)
			}
			for _, d := range ch.Delta.ToolCalls {
				for len(msg.ToolCalls) <= d.Index {
					msg.ToolCalls = append(msg.ToolCalls, toolCall{Type: "function"})
				}
				tc := &msg.ToolCalls[d.Index]
				if d.ID != "" {
					tc.ID = d.ID
				}
				tc.Function.Name += d.Function.Name
				tc.Function.Arguments += d.Function.Arguments
			}
		}
	}
	if err := sc.Err(); err != nil {
		return msg, u, fmt.Errorf("read model stream: %w", err)
	}
	msg.Content = content.String()
	return msg, u, nil
}
