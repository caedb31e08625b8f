package taskrun_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/examples"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// fakeUpstream is an OpenAI-style upstream that answers only requests that
// carry key, with a fixed usage.
func fakeUpstream(t *testing.T, key string) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+key {
			http.Error(w, `{"error":"bad key"}`, http.StatusUnauthorized)
			return
		}
		calls.Add(1)
		var req struct {
			Stream bool `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"done"},"finish_reason":"stop"}]}`+"\n\n")
			_, _ = io.WriteString(w, `data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}`+"\n\n")
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// The model API key never enters the sandbox: a run that talks to the model
// (through the relay, over the gateway's socket) finds the key nowhere in its
// env, any process's environ or any file under /taskrun, and it is in none of
// the stored objects (output, trace, artifacts, state, isolation record). The
// gateway meters the tokens.
func TestRunTaskNeverLetsTheModelKeyIn(t *testing.T) {
	h := newHarness(t)
	canary := "sk-canary-" + rand.Text()
	t.Setenv("TASKRUN_TEST_MODEL_KEY", canary)
	upstream, calls := fakeUpstream(t, canary)

	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "canary1", "sh", "-c", `
/.taskrun/bin/taskrun-relay -- sh -c 'wget -qO /taskrun/artifacts/answer.json --header "Content-Type: application/json" \
  --post-data "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" $OPENAI_BASE_URL/chat/completions'
cat /taskrun/artifacts/answer.json; echo
env
cat /proc/*/environ | tr '\0' '\n'
find /taskrun -type f ! -name '*.sock' -exec cat {} + 2>/dev/null
echo forged > /taskrun/global/traces/s1/gw_canary1.jsonl
`)
	in.HelpersDir = testbin.Dir(t)
	in.Model = config.ModelEntry{Provider: config.ProviderOpenAI, Name: "gpt-test", BaseURL: upstream.URL, APIKeyEnv: "TASKRUN_TEST_MODEL_KEY"}

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	require.EqualValues(t, 1, calls.Load(), "the request reached the upstream with the key injected host-side")
	assert.Contains(t, out.Result.OutputStr, `"content":"done"`)
	assert.NotContains(t, out.Result.OutputStr, canary)

	require.NotEmpty(t, out.Stored)
	for _, obj := range out.Stored {
		rc, err := h.Store.Open(context.Background(), obj.Key)
		require.NoError(t, err)
		data, err := io.ReadAll(rc)
		rc.Close()
		require.NoError(t, err)
		assert.NotContains(t, string(data), canary, "stored object %s", obj.Key)
	}
	require.NotNil(t, out.Result.PromptTokens)
	assert.Equal(t, 11, *out.Result.PromptTokens)
	rc, err := h.Store.OpenGlobalFile(context.Background(), h.Tenant, "traces/s1/gw_canary1.jsonl")
	require.NoError(t, err, "the executor-owned gateway record is stored")
	record, err := io.ReadAll(rc)
	rc.Close()
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(record), "\n"), "one exchange, one line")
	assert.NotContains(t, string(record), "forged", "the agent cannot write the gateway record")
	assert.Equal(t, 3, *out.Result.CompletionTokens)
	assert.Equal(t, 11, *last(t, rec).PromptTokens, "the PATCH carries the metered tokens")
}

// Exceeding the run's model budget FAILS the run with the budget as reason.
func TestRunTaskModelBudgetFailsRun(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "budget1")
	in.Image = taskrun.DefaultImage
	in.Command = nil
	in.Model = config.ModelEntry{Provider: config.ProviderScripted, Name: gateway.DemoScriptName, MaxRequests: 2}

	out, err := taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, gateway.ErrBudgetExceeded)
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.True(t, strings.Contains(out.Reason, "max_requests=2"), out.Reason)
	assert.Equal(t, model.StatusFailed, last(t, rec).Status)
	require.NotNil(t, last(t, rec).Error)
}

// The model gateway works under gVisor too (runsc --host-uds=open): the
// reference agent does the demo through the gateway's socket.
func TestRunTaskAgentWithModelUnderGVisor(t *testing.T) {
	h := newHarness(t)
	requireRunsc(t, h)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "gvisoragent1")
	in.Image = taskrun.DefaultImage
	in.Command = nil
	in.HelpersDir = testbin.Dir(t)
	in.Policy = sandbox.DefaultPolicy()
	in.Policy.Runtime = sandbox.RuntimeGVisor
	in.Model = config.ModelEntry{Provider: config.ProviderScripted, Name: gateway.DemoScriptName}
	ws := t.TempDir()
	require.NoError(t, os.CopyFS(ws, examples.DemoWorkspace()))
	in.Task.WorkspaceDir = ws

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	require.NotNil(t, out.Result.PromptTokens)
	assert.Positive(t, *out.Result.PromptTokens)
	rc, err := h.Store.OpenArtifact(context.Background(), h.Ref("gvisoragent1"), "report.md")
	require.NoError(t, err)
	rc.Close()
}
