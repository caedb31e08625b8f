package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
)

// startConfig runs a gateway for cfg on a socket in a temp dir.
func startConfig(t *testing.T, cfg Config) (*Gateway, *http.Client, *lockedbuf.Buffer) {
	t.Helper()
	trace := &lockedbuf.Buffer{}
	cfg.SocketPath = filepath.Join(t.TempDir(), ".gateway", "model.sock")
	cfg.Trace = trace
	cfg.Logger = quietLogger
	g, err := Start(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })
	return g, socketClient(g.SocketPath()), trace
}

// openAIModel points a model entry at an upstream, with the key from the environment.
func openAIModel(t *testing.T, upURL string) config.ModelEntry {
	t.Setenv("TEST_GATEWAY_KEY", testKey)
	return config.ModelEntry{Provider: config.ProviderOpenAI, Name: "gpt-test", BaseURL: upURL, APIKeyEnv: "TEST_GATEWAY_KEY"}
}

// rawChat posts body bytes exactly as given.
func rawChat(t *testing.T, c *http.Client, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := c.Post("http://gateway/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, out
}

// sseChunk is one SSE event carrying a content delta.
func sseChunk(content string) string {
	return `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + content + `"}}]}` + "\n\n"
}

// writeFlush writes s and flushes it to the gateway.
func writeFlush(w http.ResponseWriter, s string) {
	_, _ = io.WriteString(w, s)
	w.(http.Flusher).Flush()
}

// dialRaw opens a raw connection to the gateway socket.
func dialRaw(t *testing.T, g *Gateway) net.Conn {
	t.Helper()
	conn, err := net.Dial("unix", g.SocketPath())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestAgentHangingUpMidStreamIsStillMetered(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		writeFlush(w, sseChunk("Hel"))
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		for range 5 {
			writeFlush(w, sseChunk("lo"))
		}
		writeFlush(w, `data: {"id":"c","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":7,"total_tokens":27}}`+"\n\n"+"data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	g, _, _ := startConfig(t, Config{Model: openAIModel(t, up.URL)})

	// The agent reads the first chunk and hangs up.
	conn := dialRaw(t, g)
	body := `{"messages":[{"role":"user","content":"hi"}],"stream":true}`
	_, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	rd := bufio.NewReader(conn)
	for {
		line, err := rd.ReadString('\n')
		require.NoError(t, err)
		if strings.HasPrefix(line, "data:") {
			break
		}
	}
	require.NoError(t, conn.Close())

	// The upstream finishes after the agent left, while the gateway closes.
	closed := make(chan error, 1)
	go func() { closed <- g.Close() }()
	close(release)
	require.NoError(t, <-closed)
	assert.Equal(t, Usage{PromptTokens: 20, CompletionTokens: 7, Requests: 1}, g.Usage(), "the usage chunk after the hang-up is metered")
}

func TestAnswerWithoutUsageIsChargedAnEstimate(t *testing.T) {
	// An upstream that ignores include_usage.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		writeFlush(w, sseChunk("free")+"data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	g, c, trace := startConfig(t, Config{Model: openAIModel(t, up.URL)})

	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("a", 400) + `"}],"stream":true,"max_tokens":50}`
	resp, out := rawChat(t, c, body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
	require.NoError(t, g.Close())
	assert.Equal(t, Usage{PromptTokens: (len(body) + len("gpt-test") + 64 + 2) / 3, CompletionTokens: 50, Requests: 1}, g.Usage())
	assert.Contains(t, trace.String(), `"usage_estimated":true`)
}

func TestCloseCancelsAHungExchangeAndChargesAnEstimate(t *testing.T) {
	entered := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		writeFlush(w, sseChunk("thinking"))
		close(entered)
		<-r.Context().Done()
	}))
	t.Cleanup(up.Close)
	g, c, _ := startConfig(t, Config{Model: openAIModel(t, up.URL), CloseGrace: 100 * time.Millisecond})

	body := `{"messages":[{"role":"user","content":"hang"}],"stream":true,"max_completion_tokens":40}`
	go func() {
		if resp, err := c.Post("http://gateway/v1/chat/completions", "application/json", strings.NewReader(body)); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	<-entered
	require.NoError(t, g.Close())
	assert.Equal(t, Usage{PromptTokens: (len(body) + len("gpt-test") + 64 + 2) / 3, CompletionTokens: 40, Requests: 1}, g.Usage(), "Close meters the exchange it cancels")
}

func TestExchangesRunOneAtATime(t *testing.T) {
	var inflight, most atomic.Int32
	entered := make(chan struct{}, 2)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		entered <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	t.Cleanup(up.Close)
	g, c, _ := startConfig(t, Config{Model: openAIModel(t, up.URL)})

	var wg sync.WaitGroup
	statuses := make([]int, 2)
	for i := range 2 {
		wg.Go(func() {
			resp, _ := rawChat(t, c, `{"messages":[{"role":"user","content":"parallel"}]}`)
			statuses[i] = resp.StatusCode
		})
	}
	<-entered
	// Either the second request waits at the gateway, or (unprotected) it reaches the upstream.
	require.Eventually(t, func() bool { return g.waiting.Load() == 1 || inflight.Load() == 2 }, testdeadline.Scale(10*time.Second), 5*time.Millisecond)
	close(release)
	wg.Wait()
	assert.Equal(t, []int{http.StatusOK, http.StatusOK}, statuses)
	assert.Equal(t, int32(1), most.Load(), "the upstream never saw two exchanges at once")
	assert.Equal(t, Usage{PromptTokens: 2, CompletionTokens: 2, Requests: 2}, g.Usage())
}

func TestCompletionLimitsAreClampedToWhatTheBudgetLeaves(t *testing.T) {
	seen := make(chan map[string]any, 4)
	up := fakeOpenAI(t, seen) // each answer costs 11+3 tokens
	m := openAIModel(t, up.URL+"/v1")
	m.MaxTokens = 100
	_, c, _ := startConfig(t, Config{Model: m})

	// What is left of the budget, minus the request's estimated prompt
	// (one token per 3 bytes of the body, model name and 64 bytes the
	// gateway may add, rounded up), is the most it may complete.
	left := 100
	for _, tc := range []struct {
		body   string
		limits []string
		absent string
	}{
		{`{"messages":[],"max_tokens":500}`, []string{"max_tokens"}, "max_completion_tokens"},
		{`{"messages":[]}`, []string{"max_completion_tokens"}, "max_tokens"},
		{`{"messages":[],"max_tokens":1000,"max_completion_tokens":5}`, nil, ""},
	} {
		resp, out := rawChat(t, c, tc.body)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
		got := <-seen
		want := float64(left - (len(tc.body)+len("gpt-test")+64+2)/3)
		for _, k := range tc.limits {
			assert.Equal(t, want, got[k], "%s in %s", k, tc.body)
		}
		if tc.absent != "" {
			assert.NotContains(t, got, tc.absent, tc.body)
		}
		if tc.limits == nil {
			assert.Equal(t, want, got["max_tokens"], "the larger limit is clamped")
			assert.Equal(t, float64(5), got["max_completion_tokens"], "a smaller limit is kept")
		}
		left -= 14
	}

	// Without a token budget the agent's limits pass unchanged.
	m.MaxTokens = 0
	_, c, _ = startConfig(t, Config{Model: m})
	rawChat(t, c, `{"messages":[],"max_tokens":500}`)
	got := <-seen
	assert.Equal(t, float64(500), got["max_tokens"])
	assert.NotContains(t, got, "max_completion_tokens")
}

func TestLookAlikeAndDuplicateKeysAreRefused(t *testing.T) {
	seen := make(chan map[string]any, 8)
	up := fakeOpenAI(t, seen)
	g, c, _ := startConfig(t, Config{Model: openAIModel(t, up.URL+"/v1")})

	for _, body := range []string{
		`{"messages":[],"stream":true,"STREAM":false}`,
		`{"messages":[],"Stream":true}`,
		`{"messages":[],"stream":false,"stream":true}`,
		`{"messages":[],"stream":true,"stream_options":{"include_usage":true,"Include_Usage":false}}`,
		`{"messages":[],"stream":"yes"}`,
		`{"messages":[],"Max_Tokens":100000}`,
		`{"messages":[],"model":"a","MODEL":"b"}`,
		`{"messages":[]} {"stream":true}`,
	} {
		resp, out := rawChat(t, c, body)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", body, out)
	}
	assert.Empty(t, seen, "no refused request reached the upstream")
	assert.Equal(t, 0, g.Usage().Requests)

	resp, out := rawChat(t, c, `{"messages":[],"stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
	assert.Equal(t, map[string]any{"include_usage": true}, (<-seen)["stream_options"])
	assert.Equal(t, 27, g.Usage().TotalTokens())
}

func TestConnectionsAreLimited(t *testing.T) {
	g, _, _ := start(t, config.ModelEntry{Provider: config.ProviderScripted, Name: DemoScriptName})
	held := make([]net.Conn, maxConnections)
	for i := range held {
		held[i] = dialRaw(t, g)
	}
	// Make sure every held connection was accepted by the server.
	for _, conn := range held {
		_, err := io.WriteString(conn, "GET /v1/models HTTP/1.1\r\nHost: gateway\r\n\r\n")
		require.NoError(t, err)
		status, err := bufio.NewReader(conn).ReadString('\n')
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(status, "HTTP/1.1 200"), status)
	}

	extra := dialRaw(t, g)
	_, err := io.WriteString(extra, "GET /v1/models HTTP/1.1\r\nHost: gateway\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, extra.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = extra.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a connection past the limit is not served")

	require.NoError(t, held[0].Close())
	require.NoError(t, extra.SetReadDeadline(time.Time{}))
	status, err := bufio.NewReader(extra).ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(status, "HTTP/1.1 200"), "served once a slot frees: %s", status)
}
