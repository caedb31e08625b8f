package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/internal/lockedbuf"
)

// worstCaseUpstream bills like a real API at its most expensive: every
// choice asked for (n) spends the whole completion limit (or 4,000 tokens
// without one), and the prompt costs a token per 4 bytes of body.
func worstCaseUpstream(t *testing.T, requests *atomic.Int32) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		body, _ := io.ReadAll(r.Body)
		var req struct {
			N                   *int `json:"n"`
			MaxTokens           *int `json:"max_tokens"`
			MaxCompletionTokens *int `json:"max_completion_tokens"`
		}
		require.NoError(t, json.Unmarshal(body, &req))
		n, completion := 1, 4000
		if req.N != nil {
			n = *req.N
		}
		for _, limit := range []*int{req.MaxTokens, req.MaxCompletionTokens} {
			if limit != nil && *limit < completion {
				completion = *limit
			}
		}
		prompt := len(body) / 4
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, prompt, n*completion, prompt+n*completion)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestManyChoicesAreRefused(t *testing.T) {
	var requests atomic.Int32
	up := worstCaseUpstream(t, &requests)
	m := openAIModel(t, up.URL)
	m.MaxTokens = 1000
	g, c, _ := startConfig(t, Config{Model: m})

	resp, out := rawChat(t, c, `{"messages":[{"role":"user","content":"hi"}],"n":100}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, string(out))
	assert.Contains(t, string(out), "n=100")
	assert.Zero(t, requests.Load(), "n=100 never reaches the upstream")

	resp, out = rawChat(t, c, `{"messages":[{"role":"user","content":"hi"}],"n":1}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
	require.NoError(t, g.Close())
	assert.LessOrEqual(t, g.Usage().TotalTokens(), 1000)
}

func TestTokenBudgetHoldsAgainstTheMostExpensiveUpstream(t *testing.T) {
	var requests atomic.Int32
	up := worstCaseUpstream(t, &requests)
	m := openAIModel(t, up.URL)
	m.MaxTokens = 1000
	g, c, trace := startConfig(t, Config{Model: m})

	// Each request spends all it may complete: the budget runs out, and the
	// last requests' prompts alone do not fit in what is left.
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("word ", 60) + `"}]}`
	var refused *http.Response
	var refusedBody []byte
	for range 20 {
		resp, out := rawChat(t, c, body)
		if resp.StatusCode != http.StatusOK {
			refused, refusedBody = resp, out
			break
		}
	}
	require.NotNil(t, refused, "the budget ran out")
	assert.Equal(t, http.StatusTooManyRequests, refused.StatusCode)
	assert.Equal(t, "false", refused.Header.Get("x-should-retry"), "SDKs must not retry a spent budget")
	var e struct {
		Error struct{ Type, Message string }
	}
	require.NoError(t, json.Unmarshal(refusedBody, &e))
	assert.Equal(t, "budget_exceeded", e.Error.Type)

	before := requests.Load()
	resp, _ := rawChat(t, c, `{"messages":[{"role":"user","content":"tiny"}],"max_tokens":1}`)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, before, requests.Load(), "no refused request reaches the upstream")

	require.NoError(t, g.Close())
	t.Logf("budget 1000: %d requests forwarded, %d tokens used", requests.Load(), g.Usage().TotalTokens())
	assert.LessOrEqual(t, g.Usage().TotalTokens(), 1000, "the token budget is not overshot")
	assert.Greater(t, g.Usage().TotalTokens(), 800, "most of the budget was usable")
	require.ErrorIs(t, g.Err(), ErrBudgetExceeded)
	assert.Contains(t, trace.String(), `"request_summary":{`, "refused requests are summarized, not recorded")
}

func TestOversizedRequestsAreRefusedAndLargeBodiesSummarized(t *testing.T) {
	var requests atomic.Int32
	up := worstCaseUpstream(t, &requests)
	g, c, trace := startConfig(t, Config{Model: openAIModel(t, up.URL)})

	// Over MaxRequestBytes: refused with a JSON error, declared length or not.
	huge := `{"messages":[{"role":"user","content":"` + strings.Repeat("a", MaxRequestBytes) + `"}]}`
	resp, out := rawChat(t, c, huge)
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	var e struct {
		Error struct{ Type, Message string }
	}
	require.NoError(t, json.Unmarshal(out, &e), string(out))
	assert.Equal(t, codeTooLarge, e.Error.Type)
	assert.Contains(t, e.Error.Message, "16 MiB")
	req, err := http.NewRequest(http.MethodPost, "http://gateway/v1/chat/completions", io.MultiReader(strings.NewReader(huge)))
	require.NoError(t, err)
	req.ContentLength = -1 // chunked: the size is only known while reading
	resp, err = c.Do(req)
	require.NoError(t, err)
	out, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, string(out))
	assert.Zero(t, requests.Load())

	// Over the record cap but under the request cap: forwarded, summarized in the record.
	big := `{"messages":[{"role":"user","content":"` + strings.Repeat("b", MaxRecordedBodyBytes) + `"}],"max_tokens":1}`
	resp, out = rawChat(t, c, big)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
	require.NoError(t, g.Close())
	lines := strings.Split(strings.TrimSpace(trace.String()), "\n")
	require.Len(t, lines, 3)
	assert.Less(t, len(trace.String()), 64<<10, "no body over the cap is recorded")
	var last exchange
	require.NoError(t, json.Unmarshal([]byte(lines[2]), &last))
	require.NotNil(t, last.RequestSummary)
	assert.Equal(t, len(big), last.RequestSummary.Bytes)
	assert.Len(t, last.RequestSummary.SHA256, 64)
	assert.Nil(t, last.Request)
}

func TestStreamEventsPastTheRecordCapAreCounted(t *testing.T) {
	piece := strings.Repeat("x", 1000)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 1000 {
			_, _ = io.WriteString(w, sseChunk(piece))
		}
		_, _ = io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`+"\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	g, c, trace := startConfig(t, Config{Model: openAIModel(t, up.URL)})
	resp, out := rawChat(t, c, `{"messages":[],"stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 1000, strings.Count(string(out), piece), "the agent gets every event")
	require.NoError(t, g.Close())
	assert.Less(t, len(trace.String()), MaxRecordedBodyBytes+64<<10)
	var x exchange
	require.NoError(t, json.Unmarshal([]byte(trace.String()), &x))
	assert.Greater(t, x.ChunksOmitted, 700)
	assert.Equal(t, 2, g.Usage().TotalTokens(), "usage after the cap is still metered")
}

// failingWriter accepts limit bytes, then refuses every write.
type failingWriter struct {
	buf   lockedbuf.Buffer
	limit int
}

var errRecordFull = errors.New("record budget spent")

func (f *failingWriter) Write(p []byte) (int, error) {
	if len(f.buf.String())+len(p) > f.limit {
		return 0, errRecordFull
	}
	return f.buf.Write(p)
}

func TestNothingIsRecordedInFullOnceTheRecordRefusesAWrite(t *testing.T) {
	rec := &failingWriter{limit: 100}
	g, err := Start(t.Context(), Config{
		SocketPath: t.TempDir() + "/m.sock", Trace: rec, Logger: quietLogger,
		Model: config.ModelEntry{Provider: config.ProviderScripted, Name: DemoScriptName},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })
	c := socketClient(g.SocketPath())
	secret := "body-text-" + strings.Repeat("z", 50)
	for range 2 {
		resp, out := rawChat(t, c, `{"messages":[{"role":"user","content":"`+secret+`"}]}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
	}
	// The first line was refused (too long); the writer got only bodiless lines after.
	rec.limit = 1 << 20
	resp, _ := rawChat(t, c, `{"messages":[{"role":"user","content":"`+secret+`"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, g.Close())
	assert.NotEmpty(t, rec.buf.String())
	assert.NotContains(t, rec.buf.String(), secret)
	assert.Contains(t, rec.buf.String(), omitRecordFailed)
}

func TestModelByID(t *testing.T) {
	_, c, _ := start(t, config.ModelEntry{Provider: config.ProviderScripted, Name: DemoScriptName})
	get := func(path string, header http.Header) (int, map[string]any) {
		req, err := http.NewRequest(http.MethodGet, "http://gateway"+path, nil)
		require.NoError(t, err)
		req.Header = header
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var v map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
		return resp.StatusCode, v
	}
	status, v := get("/v1/models/scripted", nil)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "scripted", v["id"])
	status, v = get("/v1/models/gpt-4o", nil)
	assert.Equal(t, http.StatusNotFound, status)
	assert.Equal(t, codeNotFound, v["error"].(map[string]any)["type"], "OpenAI error shape")
	status, v = get("/v1/models/claude-x", http.Header{"Anthropic-Version": {"2023-06-01"}})
	assert.Equal(t, http.StatusNotFound, status)
	assert.Equal(t, "error", v["type"], "Anthropic error shape")
	assert.Equal(t, "not_found_error", v["error"].(map[string]any)["type"])
}

func TestUpstreamFailuresAreTypedAndHiddenFromTheAgent(t *testing.T) {
	status := atomic.Int32{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s := int(status.Load()); s != http.StatusOK {
			// Real error pages name where they came from.
			http.Error(w, `{"error":{"message":"invalid key at http://`+r.Host+`/v1"}}`, s)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	t.Cleanup(up.Close)
	host := strings.TrimPrefix(up.URL, "http://")
	var hostLog lockedbuf.Buffer
	g, c, trace := startConfig(t, Config{Model: openAIModel(t, up.URL)})
	g.log = slog.New(slog.NewTextHandler(&hostLog, nil))

	for _, tc := range []struct {
		status     int
		noRetry    bool
		wantReason string
	}{
		{http.StatusUnauthorized, true, "model upstream answered 401 Unauthorized"},
		{http.StatusNotFound, true, "model upstream answered 404 Not Found"},
		{http.StatusServiceUnavailable, false, "model upstream answered 503 Service Unavailable"},
	} {
		status.Store(int32(tc.status))
		resp, out := rawChat(t, c, `{"messages":[]}`)
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		assert.NotContains(t, string(out), host, "the agent never learns where the upstream is")
		assert.Contains(t, string(out), tc.wantReason)
		if tc.noRetry {
			assert.Equal(t, "false", resp.Header.Get("x-should-retry"))
		}
		err := g.UpstreamErr()
		var ue *UpstreamError
		require.ErrorAs(t, err, &ue)
		require.ErrorIs(t, err, ErrUpstream)
		assert.Equal(t, tc.status, ue.Status)
		assert.Equal(t, tc.wantReason, err.Error())
	}
	assert.Contains(t, trace.String(), "invalid key at", "the host's record keeps the upstream's words")
	assert.Contains(t, hostLog.String(), "level=WARN msg=\"model upstream failed", "the host log warns")
	assert.Contains(t, hostLog.String(), host, "the host log says which upstream")

	// A later success clears the failure.
	status.Store(http.StatusOK)
	resp, _ := rawChat(t, c, `{"messages":[]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, g.UpstreamErr())

	// An upstream that cannot be reached.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())
	g2, c2, _ := startConfig(t, Config{Model: openAIModel(t, "http://"+closed+"/v1")})
	resp, out := rawChat(t, c2, `{"messages":[]}`)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.NotContains(t, string(out), closed)
	assert.NotContains(t, string(out), "127.0.0.1")
	var ue *UpstreamError
	require.ErrorAs(t, g2.UpstreamErr(), &ue)
	assert.Zero(t, ue.Status)
	assert.ErrorIs(t, ue, syscall.ECONNREFUSED)
	assert.True(t, strings.HasPrefix(ue.Error(), "model upstream unreachable: "), ue.Error())
	assert.Equal(t, 0, g2.Usage().TotalTokens(), "a failed exchange costs nothing")
}
