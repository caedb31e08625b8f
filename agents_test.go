package taskrun_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// Variables the caller gives reach the agent; taskrun's own win.
func TestRunTaskEnvReachesTheAgent(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "env1", "sh", "-c", `echo "[$GREETING][$EMPTY][$HOME][$TASKRUN_RUN_ID]"`)
	in.Env = []string{"GREETING=hello world", "EMPTY="}
	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, "[hello world][][/taskrun/home][env1]\n", out.Result.OutputStr)
}

// A name taskrun sets itself is refused before anything runs.
func TestRunTaskRefusesReservedEnvNames(t *testing.T) {
	h := newHarness(t)
	for _, kv := range []string{"HOME=/root", "TASKRUN_RUN_ID=forged", "https_proxy=http://elsewhere:3128"} {
		rec := &controlplanetest.Recorder{}
		in := h.input(rec, "envbad", "true")
		in.Env = []string{"OK=1", kv}
		out, err := taskrun.Execute(context.Background(), in)
		require.ErrorIs(t, err, taskrun.ErrInvalidInput, kv)
		require.ErrorIs(t, err, config.ErrBadEnv, kv)
		assert.Contains(t, err.Error(), "is set by taskrun", kv)
		if out != nil {
			assert.Empty(t, out.ContainerID, "nothing ran")
		}
	}
	assert.NoDirExists(t, filepath.Join(h.Root, "users", h.Tenant, "conversations", h.ConversationID, "tasks", h.TaskID, "runs", "envbad"))
}

// When the model upstream refuses the host's key, the run's reason says so,
// not just that the agent exited 1, and the agent never learns the
// upstream's address.
func TestRunTaskModelUpstreamFailureIsTheReason(t *testing.T) {
	h := newHarness(t)
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, `{"error":{"message":"Incorrect API key provided at `+r.Host+`"}}`, http.StatusUnauthorized)
	}))
	t.Cleanup(up.Close)
	t.Setenv("TASKRUN_TEST_WRONG_KEY", "sk-wrong")
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "upstream401", "sh", "-c", `
/.taskrun/bin/taskrun-relay -- sh -c 'wget -q -O - --header "Content-Type: application/json" \
  --post-data "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" "$OPENAI_BASE_URL/chat/completions" 2>&1; exit 1'`)
	in.HelpersDir = testbin.Dir(t)
	in.Model = config.ModelEntry{Provider: config.ProviderOpenAI, Name: "gpt-test", BaseURL: up.URL + "/v1", APIKeyEnv: "TASKRUN_TEST_WRONG_KEY"}

	out, err := taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, taskrun.ErrRunFailed)
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.Equal(t, "model upstream answered 401 Unauthorized (the agent exited with code 1)", out.Reason)
	assert.EqualValues(t, 1, calls.Load())
	assert.NotContains(t, out.Result.OutputStr, strings.TrimPrefix(up.URL, "http://"), "the agent never sees the upstream's address")
	require.NotNil(t, last(t, rec).Error)
	assert.Contains(t, *last(t, rec).Error, "model upstream answered 401")
}

// An agent built on the official OpenAI and Anthropic SDKs, in an image
// built FROM scratch, with nothing but the base URLs taskrun-relay sets,
// gets streamed answers from all three APIs of the scripted model.
func TestRunTaskSDKAgentThroughRelay(t *testing.T) {
	h := newHarness(t)
	ws := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(ws, "sdkagent"), "./gateway/internal/sdkagent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build sdkagent: %s", out)
	script := filepath.Join(t.TempDir(), "s.jsonl")
	require.NoError(t, os.WriteFile(script, []byte(strings.Repeat(`{"content":"Hi.","tool_calls":[{"id":"c1","name":"list_dir","arguments":{"path":"."}}],"usage":{"prompt_tokens":30,"completion_tokens":4}}`+"\n", 3)), 0o644))

	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "sdkagent1", "/.taskrun/bin/taskrun-relay", "--", "/taskrun/home/sdkagent")
	in.Image = taskrun.DefaultImage // FROM scratch: no shell
	in.Task.WorkspaceDir = ws
	in.HelpersDir = testbin.Dir(t)
	in.Model = config.ModelEntry{Provider: config.ProviderScripted, Name: script}

	res, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err, "output: %s", res.Result.OutputStr)
	var apis []string
	for _, line := range strings.Split(strings.TrimSpace(res.Result.OutputStr), "\n") {
		var r struct {
			API       string   `json:"api"`
			Text      string   `json:"text"`
			ToolCalls []string `json:"tool_calls"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		apis = append(apis, r.API)
		assert.Equal(t, "Hi.", r.Text)
		assert.Equal(t, []string{`list_dir {"path":"."}`}, r.ToolCalls)
	}
	assert.Equal(t, []string{"chat.completions", "responses", "messages"}, apis)
	require.NotNil(t, res.Result.PromptTokens)
	assert.Equal(t, 90, *res.Result.PromptTokens)
	assert.Equal(t, 12, *res.Result.CompletionTokens)
}

// chatScript asks the model one question through OPENAI_BASE_URL and prints
// the answer; it exits 3 when the request fails. Busybox wget ignores
// NO_PROXY, so it is told not to use the egress proxy for the relay.
const chatScript = `wget -Y off -q -O - --header "Content-Type: application/json" \
  --post-data "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" "$OPENAI_BASE_URL/chat/completions" || exit 3`

// An own agent is run one way whatever the run's egress: taskrun starts the
// relay in front of it, so a bare command finds the model at
// OPENAI_BASE_URL, and the documented `taskrun-relay -- AGENT` still works,
// with egress on as well (the inner relay only runs the agent).
func TestRunTaskStartsTheRelayForTheAgent(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name   string
		egress bool
		cmd    []string
	}{
		{name: "bare", cmd: []string{"sh", "-c", chatScript}},
		{name: "relay", cmd: []string{"/.taskrun/bin/taskrun-relay", "--", "sh", "-c", chatScript}},
		{name: "egress-bare", egress: true, cmd: []string{"sh", "-c", chatScript}},
		{name: "egress-relay", egress: true, cmd: []string{"/.taskrun/bin/taskrun-relay", "--", "sh", "-c", chatScript}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &controlplanetest.Recorder{}
			in := h.input(rec, "relayed-"+tc.name, tc.cmd...)
			in.HelpersDir = testbin.Dir(t)
			in.Model = config.ModelEntry{Provider: config.ProviderScripted, Name: gateway.DemoScriptName}
			if tc.egress {
				in.Egress = egress.Policy{Rules: []egress.Rule{{Host: "127.0.0.1", Port: 1}}}
			}
			out, err := taskrun.Execute(context.Background(), in)
			require.NoError(t, err, "reason: %s; output: %s", out.Reason, out.Result.OutputStr)
			assert.Contains(t, out.Result.OutputStr, `"chat.completion"`)
			require.NotNil(t, out.Result.PromptTokens)
			assert.Positive(t, *out.Result.PromptTokens, "the gateway metered the request")
		})
	}
}

// Entrypoint replaces the image's entrypoint as docker run --entrypoint
// does, behind the self-check and the relay: the command is its arguments.
func TestRunTaskEntrypoint(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "entrypoint1", "-c", `echo "[$0] $OPENAI_BASE_URL"`, "from-entrypoint")
	in.Entrypoint = []string{"/bin/sh"}
	in.HelpersDir = testbin.Dir(t)
	in.Model = config.ModelEntry{Provider: config.ProviderScripted, Name: gateway.DemoScriptName}
	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err, "reason: %s", out.Reason)
	assert.Equal(t, "[from-entrypoint] http://127.0.0.1:8411/v1\n", out.Result.OutputStr)
}
