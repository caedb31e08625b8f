package relay

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unixServer serves h on a unix socket in a temp dir.
func unixServer(t *testing.T, h http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "model.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
	srv.Start()
	t.Cleanup(srv.Close)
	return sock
}

func TestRelayForwardsToSocket(t *testing.T) {
	sock := unixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, part := range []string{"data: one\n\n", "data: " + string(body) + "\n\n"} {
			_, _ = io.WriteString(w, part)
			w.(http.Flusher).Flush()
		}
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- (&relay{socket: sock, log: slog.New(slog.DiscardHandler)}).serve(ctx, ln) }()

	for i := 0; i < 3; i++ {
		resp, err := http.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(`{"n":1}`))
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, "data: one\n\ndata: {\"n\":1}\n\n", string(body))
	}
	cancel()
	require.NoError(t, <-served)
}

func TestRelayRefusesNonLoopbackListen(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:8411", ":8411", "10.0.0.1:8411"} {
		_, err := parseOptions([]string{"-listen", addr}, func(string) string { return "" })
		require.ErrorIs(t, err, errBadUsage, addr)
	}
	o, err := parseOptions([]string{"--", "agent", "-x"}, func(k string) string {
		return map[string]string{"TASKRUN_MODEL_SOCKET": "/s.sock"}[k]
	})
	require.NoError(t, err)
	assert.Equal(t, "/s.sock", o.socket)
	assert.Equal(t, []string{"agent", "-x"}, o.command)
}

func TestRelayRunsCommandWithBaseURL(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh on this machine")
	}
	out := filepath.Join(t.TempDir(), "env")
	code, err := run(context.Background(), options{
		listen:  "127.0.0.1:0",
		socket:  filepath.Join(t.TempDir(), "none.sock"),
		command: []string{"/bin/sh", "-c", `echo "$OPENAI_BASE_URL $ANTHROPIC_BASE_URL" > "$0"; exit 7`, out},
	}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	assert.Equal(t, 7, code, "the command's exit status is the relay's")
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Regexp(t, `^http://127\.0\.0\.1:(\d+)/v1 http://127\.0\.0\.1:\d+\n$`, string(got))
}

func TestCommandEnvKeepsTheAgentsOwnKeys(t *testing.T) {
	env := commandEnv(func(string) string { return "" }, "127.0.0.1:8411")
	assert.ElementsMatch(t, []string{
		"OPENAI_BASE_URL=http://127.0.0.1:8411/v1", "ANTHROPIC_BASE_URL=http://127.0.0.1:8411",
		"OPENAI_API_KEY=" + placeholderOpenAIKey, "ANTHROPIC_API_KEY=" + placeholderAnthropicKey,
		"TASKRUN_RELAY=127.0.0.1:8411",
	}, env)
	set := map[string]string{"OPENAI_API_KEY": "x", "ANTHROPIC_AUTH_TOKEN": "y"}
	env = commandEnv(func(k string) string { return set[k] }, "127.0.0.1:8411")
	assert.ElementsMatch(t, []string{"OPENAI_BASE_URL=http://127.0.0.1:8411/v1", "ANTHROPIC_BASE_URL=http://127.0.0.1:8411", "TASKRUN_RELAY=127.0.0.1:8411"}, env)
}

func TestRelayExposesEgressProxy(t *testing.T) {
	sock := unixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "proxied "+r.Method+" "+r.URL.String())
	}))
	o, err := parseOptions([]string{"-listen", "127.0.0.1:0", "-egress-listen", "127.0.0.1:0"}, func(k string) string {
		return map[string]string{"TASKRUN_EGRESS_SOCKET": sock}[k]
	})
	require.NoError(t, err)
	require.Equal(t, sock, o.egress.socket)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Find the port the egress relay got by listening on it ourselves first.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	o.egress.listen = ln.Addr().String()
	ln.Close()
	stop, err := startEgressRelay(ctx, o.egress, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer stop()
	proxyURL, err := url.Parse("http://" + o.egress.listen)
	require.NoError(t, err)
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
	resp, err := client.Get("http://example.test/x")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, "proxied GET http://example.test/x", string(body))

	_, err = parseOptions([]string{"-egress-listen", "0.0.0.0:8412"}, func(k string) string {
		return map[string]string{"TASKRUN_EGRESS_SOCKET": sock}[k]
	})
	require.ErrorIs(t, err, errBadUsage, "the egress relay listens on loopback only")
}
