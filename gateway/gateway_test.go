package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/examples"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/unixsock"
)

// quietLogger keeps test output readable.
var quietLogger = slog.New(slog.DiscardHandler)

// testKey is a canary: it must reach the upstream and nothing else.
const testKey = "sk-canary-7f3e9b1c2d4a5e6f"

// start runs a gateway for m on a socket in a temp dir.
func start(t *testing.T, m config.ModelEntry) (*Gateway, *http.Client, *lockedbuf.Buffer) {
	t.Helper()
	trace := &lockedbuf.Buffer{}
	g, err := Start(context.Background(), Config{SocketPath: filepath.Join(t.TempDir(), ".gateway", "model.sock"), Model: m, Trace: trace, Logger: quietLogger})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })
	return g, socketClient(g.SocketPath()), trace
}

// socketClient speaks HTTP over a unix socket.
func socketClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
}

// chat posts a chat completion request through the gateway.
func chat(t *testing.T, c *http.Client, body map[string]any) (*http.Response, []byte) {
	t.Helper()
	data, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := c.Post("http://gateway/v1/chat/completions", "application/json", bytes.NewReader(data))
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, out
}

func userMsg(text string) []map[string]any {
	return []map[string]any{{"role": "user", "content": text}}
}

// sseChunks parses the data payloads of an SSE body (without [DONE]).
func sseChunks(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var chunks []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		payload, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || payload == "[DONE]" {
			continue
		}
		var c map[string]any
		require.NoError(t, json.Unmarshal([]byte(payload), &c))
		chunks = append(chunks, c)
	}
	return chunks
}

// scriptTotals sums the usage written in a JSONL script, read independently
// of the gateway's own parser.
func scriptTotals(t *testing.T, script []byte) (prompt, completion, lines int) {
	t.Helper()
	for _, line := range bytes.Split(script, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var l struct {
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(line, &l))
		prompt += l.Usage.PromptTokens
		completion += l.Usage.CompletionTokens
		lines++
	}
	return prompt, completion, lines
}

// fakeOpenAI is an upstream that checks the injected key and answers like
// the OpenAI API, streaming only when asked and reporting usage.
func fakeOpenAI(t *testing.T, seen chan<- map[string]any) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testKey {
			http.Error(w, `{"error":{"message":"bad key"}}`, http.StatusUnauthorized)
			return
		}
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.URL.Path != "/v1/chat/completions" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		seen <- req
		if req["stream"] != true {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		opts, _ := req["stream_options"].(map[string]any)
		withUsage := opts["include_usage"] == true
		for _, piece := range []string{"Hel", "lo"} {
			chunk := map[string]any{"id": "c2", "object": "chat.completion.chunk", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": piece}}}}
			if withUsage {
				chunk["usage"] = nil
			}
			data, _ := json.Marshal(chunk)
			_, _ = io.WriteString(w, "data: "+string(data)+"\n\n")
		}
		if withUsage {
			_, _ = io.WriteString(w, `data: {"id":"c2","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":7,"total_tokens":27}}`+"\n\n")
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestOpenAIUpstreamGetsKeyHostSideAndUsageIsMetered(t *testing.T) {
	t.Setenv("TEST_GATEWAY_KEY", testKey)
	seen := make(chan map[string]any, 4)
	up := fakeOpenAI(t, seen)
	g, c, trace := start(t, config.ModelEntry{Provider: config.ProviderOpenAI, Name: "gpt-test", BaseURL: up.URL + "/v1", APIKeyEnv: "TEST_GATEWAY_KEY"})

	// The agent sends a bogus key and another model; neither reaches upstream.
	resp, body := chat(t, c, map[string]any{"model": "gpt-expensive", "messages": userMsg("hello " + "x")})
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.Equal(t, "gpt-test", (<-seen)["model"], "the configured model replaces the agent's choice")
	assert.Contains(t, string(body), `"content":"hi"`)

	// Streamed without include_usage: upstream is asked for usage, the agent never sees it.
	resp, body = chat(t, c, map[string]any{"messages": userMsg("stream"), "stream": true})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	upReq := <-seen
	assert.Equal(t, map[string]any{"include_usage": true}, upReq["stream_options"])
	chunks := sseChunks(t, body)
	require.Len(t, chunks, 2)
	for _, ch := range chunks {
		assert.NotContains(t, ch, "usage")
	}
	assert.Contains(t, string(body), "data: [DONE]")

	// Streamed with include_usage: the usage chunk is passed through.
	_, body = chat(t, c, map[string]any{"messages": userMsg("stream"), "stream": true, "stream_options": map[string]any{"include_usage": true}})
	<-seen
	chunks = sseChunks(t, body)
	require.Len(t, chunks, 3)
	assert.Equal(t, float64(27), chunks[2]["usage"].(map[string]any)["total_tokens"])

	assert.Equal(t, Usage{PromptTokens: 11 + 20 + 20, CompletionTokens: 3 + 7 + 7, Requests: 3}, g.Usage())
	require.NoError(t, g.Err())
	assert.Equal(t, 3, strings.Count(trace.String(), "\n"), "one trace line per exchange")
	assert.NotContains(t, trace.String(), testKey)
}

func TestKeyNeverReachesAgentOrTrace(t *testing.T) {
	// An upstream that echoes the key in its answers, as some error pages do.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"your key is `+auth+`"}}]}`+"\n\n")
		_, _ = io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`+"\n\n")
	}))
	t.Cleanup(up.Close)
	keyFile := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(keyFile, []byte(testKey+"\n"), 0o600))
	g, c, trace := start(t, config.ModelEntry{Provider: config.ProviderOpenAI, Name: "m", BaseURL: up.URL, APIKeyFile: keyFile})

	_, body := chat(t, c, map[string]any{"messages": userMsg("leak it"), "stream": true})
	assert.Contains(t, string(body), "your key is Bearer "+redacted)
	assert.NotContains(t, string(body), testKey)
	assert.NotContains(t, trace.String(), testKey)
	assert.Contains(t, trace.String(), redacted)
	assert.Equal(t, 2, g.Usage().TotalTokens())
}

func TestScriptedTokensEqualScriptUsage(t *testing.T) {
	wantPrompt, wantCompletion, lines := scriptTotals(t, examples.DemoScript)
	for _, stream := range []bool{false, true} {
		g, c, trace := start(t, config.ModelEntry{Provider: config.ProviderScripted, Name: DemoScriptName})
		for i := 0; i < lines; i++ {
			resp, body := chat(t, c, map[string]any{"messages": userMsg("go"), "stream": stream})
			require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			if stream {
				for _, ch := range sseChunks(t, body) {
					assert.NotContains(t, ch, "usage", "usage was not asked for")
				}
			}
		}
		assert.Equal(t, Usage{PromptTokens: wantPrompt, CompletionTokens: wantCompletion, Requests: lines}, g.Usage(), "stream=%v", stream)
		assert.Equal(t, lines, strings.Count(trace.String(), "\n"))

		resp, body := chat(t, c, map[string]any{"messages": userMsg("more"), "stream": stream})
		assert.Equal(t, http.StatusConflict, resp.StatusCode, "an exhausted script says so: %s", body)
	}
}

func TestScriptedReplaysContentAndToolCalls(t *testing.T) {
	script := filepath.Join(t.TempDir(), "s.jsonl")
	require.NoError(t, os.WriteFile(script, []byte(
		`{"content":"Looking around. ","tool_calls":[{"id":"c1","name":"list_dir","arguments":{"path":"."}}],"usage":{"prompt_tokens":5,"completion_tokens":2}}`+"\n\n"+
			`{"content":"All done.","usage":{"prompt_tokens":9,"completion_tokens":4}}`+"\n"), 0o644))
	_, c, _ := start(t, config.ModelEntry{Provider: config.ProviderScripted, Name: script})

	_, body := chat(t, c, map[string]any{"messages": userMsg("go"), "stream": true, "stream_options": map[string]any{"include_usage": true}})
	var text, args strings.Builder
	var name string
	var usage map[string]any
	for _, ch := range sseChunks(t, body) {
		if u, ok := ch["usage"].(map[string]any); ok {
			usage = u
		}
		for _, choice := range ch["choices"].([]any) {
			delta := choice.(map[string]any)["delta"].(map[string]any)
			if s, ok := delta["content"].(string); ok {
				text.WriteString(s)
			}
			if calls, ok := delta["tool_calls"].([]any); ok {
				fn := calls[0].(map[string]any)["function"].(map[string]any)
				if n, ok := fn["name"].(string); ok {
					name = n
				}
				args.WriteString(fn["arguments"].(string))
			}
		}
	}
	assert.Equal(t, "Looking around. ", text.String())
	assert.Equal(t, "list_dir", name)
	assert.JSONEq(t, `{"path":"."}`, args.String())
	assert.Equal(t, map[string]any{"prompt_tokens": float64(5), "completion_tokens": float64(2), "total_tokens": float64(7)}, usage)

	_, body = chat(t, c, map[string]any{"messages": userMsg("go")})
	var done struct {
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(body, &done))
	assert.Equal(t, "All done.", done.Choices[0].Message.Content)
	assert.Equal(t, "stop", done.Choices[0].FinishReason)
}

func TestBudgetsRefuseRequests(t *testing.T) {
	g, c, trace := start(t, config.ModelEntry{Provider: config.ProviderScripted, Name: DemoScriptName, MaxRequests: 2})
	for i := 0; i < 2; i++ {
		resp, _ := chat(t, c, map[string]any{"messages": userMsg("go")})
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.NoError(t, g.Err())
	resp, body := chat(t, c, map[string]any{"messages": userMsg("go")})
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	var e struct {
		Error struct{ Type, Message string }
	}
	require.NoError(t, json.Unmarshal(body, &e))
	assert.Equal(t, "budget_exceeded", e.Error.Type)
	require.ErrorIs(t, g.Err(), ErrBudgetExceeded)
	assert.Contains(t, g.Err().Error(), "max_requests=2")
	assert.Equal(t, 2, g.Usage().Requests)
	assert.Contains(t, trace.String(), `"status":429`)

	// The demo's first answer costs 412+23 tokens: a 300-token budget is
	// exceeded by it and the next request is refused.
	g, c, _ = start(t, config.ModelEntry{Provider: config.ProviderScripted, Name: DemoScriptName, MaxTokens: 300})
	resp, _ = chat(t, c, map[string]any{"messages": userMsg("go"), "stream": true})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.ErrorIs(t, g.Err(), ErrBudgetExceeded)
	assert.Contains(t, g.Err().Error(), "max_tokens=300")
	resp, _ = chat(t, c, map[string]any{"messages": userMsg("go"), "stream": true})
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, Usage{PromptTokens: 412, CompletionTokens: 23, Requests: 1}, g.Usage())
}

func TestModelsAndSocketLifecycle(t *testing.T) {
	g, c, _ := start(t, config.ModelEntry{Provider: config.ProviderScripted, Name: DemoScriptName})
	resp, err := c.Get("http://gateway/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	var list struct{ Data []struct{ ID string } }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	require.Len(t, list.Data, 1)
	assert.Equal(t, g.ModelName(), list.Data[0].ID)

	fi, err := os.Stat(g.SocketPath())
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, fi.Mode().Type())
	if os.Geteuid() == 0 {
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "as root the socket belongs to the agent uid alone")
	} else {
		assert.Equal(t, os.FileMode(0o777), fi.Mode().Perm())
	}
	require.NoError(t, g.Close())
	assert.NoFileExists(t, g.SocketPath())
	require.NoError(t, g.Close(), "Close is idempotent")
}

func TestStartRejectsBadConfig(t *testing.T) {
	t.Setenv("TEST_EMPTY_KEY", "")
	sock := filepath.Join(t.TempDir(), "m.sock")
	for name, m := range map[string]config.ModelEntry{
		"unknown provider": {Provider: "magic", Name: "x"},
		"no key source":    {Provider: config.ProviderOpenAI, Name: "m", BaseURL: "https://example.invalid/v1"},
		"empty key":        {Provider: config.ProviderOpenAI, Name: "m", BaseURL: "https://example.invalid/v1", APIKeyEnv: "TEST_EMPTY_KEY"},
		"bad base url":     {Provider: config.ProviderOpenAI, Name: "m", BaseURL: "ftp://x", APIKeyEnv: "HOME"},
		"no script":        {Provider: config.ProviderScripted},
		"missing script":   {Provider: config.ProviderScripted, Name: "/no/such/script.jsonl"},
	} {
		_, err := Start(context.Background(), Config{SocketPath: sock, Model: m})
		require.ErrorIs(t, err, ErrBadConfig, name)
	}
	_, err := ParseScript(strings.NewReader(`{"content":"x","usage":{},"typo":1}`))
	require.ErrorIs(t, err, ErrBadConfig, "unknown fields in a script line are refused")
}

func TestLongSocketPathIsServed(t *testing.T) {
	deep := filepath.Join(t.TempDir(), "users", strings.Repeat("u", 60), "runs", strings.Repeat("r", 60))
	sock := filepath.Join(deep, ".gateway", "model.sock")
	require.Greater(t, len(sock), unixsock.MaxPath)
	g, err := Start(context.Background(), Config{SocketPath: sock, Model: config.ModelEntry{Provider: config.ProviderScripted, Name: DemoScriptName}, Logger: quietLogger})
	require.NoError(t, err)
	fi, err := os.Stat(sock)
	require.NoError(t, err, "the socket exists at its real path")
	assert.Equal(t, os.ModeSocket, fi.Mode().Type())

	// Clients connect through a short path to the same directory.
	short := filepath.Join(t.TempDir(), "l")
	require.NoError(t, os.Symlink(filepath.Join(deep, ".gateway"), short))
	resp, err := socketClient(filepath.Join(short, "model.sock")).Get("http://gateway/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, g.Close())
	assert.NoFileExists(t, sock)
}
