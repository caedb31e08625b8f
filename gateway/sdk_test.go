package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/config"
)

// agentKey is what an agent's SDK sends as its key: it must never reach the upstream.
const agentKey = "agent-supplied-key"

// openAIClient is the official OpenAI SDK pointed at the gateway's socket.
func openAIClient(g *Gateway, retries int) openai.Client {
	return openai.NewClient(option.WithBaseURL("http://gateway/v1/"), option.WithHTTPClient(socketClient(g.SocketPath())),
		option.WithAPIKey(agentKey), option.WithMaxRetries(retries))
}

// anthropicClient is the official Anthropic SDK pointed at the gateway's socket.
func anthropicClient(g *Gateway, retries int) anthropic.Client {
	return anthropic.NewClient(aoption.WithBaseURL("http://gateway/"), aoption.WithHTTPClient(socketClient(g.SocketPath())),
		aoption.WithAPIKey(agentKey), aoption.WithMaxRetries(retries))
}

// sdkScript has two answers, each with text and a tool call, and usage
// with cache reads and writes.
const sdkScript = `{"content":"Looking around. ","tool_calls":[{"id":"call_a","name":"list_dir","arguments":{"path":"."}}],"usage":{"prompt_tokens":50,"completion_tokens":7,"cache_read_tokens":20,"cache_write_tokens":5}}
{"content":"Reading it now.","tool_calls":[{"id":"call_b","name":"read_file","arguments":{"path":"notes.txt"}}],"usage":{"prompt_tokens":80,"completion_tokens":11,"cache_read_tokens":30,"cache_write_tokens":2}}
`

// recordLines counts the exchanges the gateway recorded: every request that reached it.
func recordLines(trace interface{ String() string }) int { return strings.Count(trace.String(), "\n") }

var listDirSchema = map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}}

func TestOpenAISDKChatCompletionsOnScriptedProvider(t *testing.T) {
	g, _, _ := startScriptedTrace(t, config.ModelEntry{})
	client := openAIClient(g, 0)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:    "anything",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("look around")},
		Tools:    []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "list_dir", Parameters: listDirSchema})},
	}
	done, err := client.Chat.Completions.New(ctx, params)
	require.NoError(t, err)
	require.Len(t, done.Choices, 1)
	assert.Equal(t, "Looking around. ", done.Choices[0].Message.Content)
	require.Len(t, done.Choices[0].Message.ToolCalls, 1)
	assert.Equal(t, "list_dir", done.Choices[0].Message.ToolCalls[0].Function.Name)
	assert.JSONEq(t, `{"path":"."}`, done.Choices[0].Message.ToolCalls[0].Function.Arguments)
	assert.Equal(t, int64(57), done.Usage.TotalTokens)
	assert.Equal(t, int64(20), done.Usage.PromptTokensDetails.CachedTokens)

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		require.True(t, acc.AddChunk(stream.Current()))
	}
	require.NoError(t, stream.Err())
	assert.Equal(t, "Reading it now.", acc.Choices[0].Message.Content)
	require.Len(t, acc.Choices[0].Message.ToolCalls, 1)
	assert.Equal(t, "call_b", acc.Choices[0].Message.ToolCalls[0].ID)
	assert.JSONEq(t, `{"path":"notes.txt"}`, acc.Choices[0].Message.ToolCalls[0].Function.Arguments)
	assert.Equal(t, int64(80), acc.Usage.PromptTokens)
	assert.Equal(t, int64(11), acc.Usage.CompletionTokens)

	require.NoError(t, g.Close())
	assert.Equal(t, Usage{PromptTokens: 130, CompletionTokens: 18, Requests: 2, CacheReadTokens: 50}, g.Usage())
}

func TestOpenAISDKResponsesOnScriptedProvider(t *testing.T) {
	g, _, _ := startScriptedTrace(t, config.ModelEntry{})
	client := openAIClient(g, 0)
	ctx := context.Background()
	params := responses.ResponseNewParams{
		Model: "anything",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("look around")},
		Tools: []responses.ToolUnionParam{responses.ToolParamOfFunction("list_dir", listDirSchema, false)},
	}
	resp, err := client.Responses.New(ctx, params)
	require.NoError(t, err)
	assert.Equal(t, "Looking around. ", resp.OutputText())
	var calls []responses.ResponseFunctionToolCall
	for _, item := range resp.Output {
		if item.Type == "function_call" {
			calls = append(calls, item.AsFunctionCall())
		}
	}
	require.Len(t, calls, 1)
	assert.Equal(t, "call_a", calls[0].CallID)
	assert.JSONEq(t, `{"path":"."}`, calls[0].Arguments)
	assert.Equal(t, int64(50), resp.Usage.InputTokens)
	assert.Equal(t, int64(20), resp.Usage.InputTokensDetails.CachedTokens)
	assert.Equal(t, int64(7), resp.Usage.OutputTokens)

	stream := client.Responses.NewStreaming(ctx, params)
	var acc responses.ResponseAccumulator
	var text strings.Builder
	var completed *responses.Response
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.AsResponseOutputTextDelta().Delta)
		case "response.completed":
			r := ev.AsResponseCompleted().Response
			completed = &r
		}
		var wsEvent responses.ResponsesServerEventUnion
		require.NoError(t, json.Unmarshal([]byte(ev.RawJSON()), &wsEvent))
		require.NoError(t, acc.AddEvent(wsEvent), ev.Type)
	}
	require.NoError(t, stream.Err())
	assert.Equal(t, "Reading it now.", text.String())
	snap := acc.Snapshot()
	assert.Equal(t, "response.completed", snap.TerminalEvent)
	assert.Equal(t, "Reading it now.", snap.OutputText())
	require.Len(t, snap.Output, 2)
	assert.Equal(t, "read_file", snap.Output[1].Name)
	assert.JSONEq(t, `{"path":"notes.txt"}`, snap.Output[1].Arguments)
	require.NotNil(t, completed)
	assert.Equal(t, int64(80), completed.Usage.InputTokens)
	assert.Equal(t, int64(11), completed.Usage.OutputTokens)

	require.NoError(t, g.Close())
	assert.Equal(t, Usage{PromptTokens: 130, CompletionTokens: 18, Requests: 2, CacheReadTokens: 50}, g.Usage())
}

func TestAnthropicSDKMessagesOnScriptedProvider(t *testing.T) {
	g, _, _ := startScriptedTrace(t, config.ModelEntry{})
	client := anthropicClient(g, 0)
	ctx := context.Background()
	params := anthropic.MessageNewParams{
		Model:     "anything",
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("look around"))},
		Tools:     []anthropic.ToolUnionParam{anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{Properties: listDirSchema["properties"]}, "list_dir")},
	}
	msg, err := client.Messages.New(ctx, params)
	require.NoError(t, err)
	require.Len(t, msg.Content, 2)
	assert.Equal(t, "Looking around. ", msg.Content[0].Text)
	assert.Equal(t, "list_dir", msg.Content[1].Name)
	assert.JSONEq(t, `{"path":"."}`, string(msg.Content[1].Input))
	assert.Equal(t, anthropic.StopReasonToolUse, msg.StopReason)
	assert.Equal(t, int64(50-20-5), msg.Usage.InputTokens)
	assert.Equal(t, int64(20), msg.Usage.CacheReadInputTokens)
	assert.Equal(t, int64(5), msg.Usage.CacheCreationInputTokens)

	stream := client.Messages.NewStreaming(ctx, params)
	acc := anthropic.Message{}
	for stream.Next() {
		require.NoError(t, acc.Accumulate(stream.Current()))
	}
	require.NoError(t, stream.Err())
	require.Len(t, acc.Content, 2)
	assert.Equal(t, "Reading it now.", acc.Content[0].Text)
	assert.Equal(t, "call_b", acc.Content[1].ID)
	assert.JSONEq(t, `{"path":"notes.txt"}`, string(acc.Content[1].Input))
	assert.Equal(t, int64(80-30-2), acc.Usage.InputTokens)
	assert.Equal(t, int64(11), acc.Usage.OutputTokens)

	require.NoError(t, g.Close())
	assert.Equal(t, Usage{PromptTokens: 130, CompletionTokens: 18, Requests: 2, CacheReadTokens: 50, CacheWriteTokens: 7}, g.Usage())
}

func TestSDKsGetTheModel(t *testing.T) {
	g, _, _ := startScriptedTrace(t, config.ModelEntry{})
	ctx := context.Background()
	oc, ac := openAIClient(g, 0), anthropicClient(g, 0)
	m, err := oc.Models.Get(ctx, "scripted")
	require.NoError(t, err)
	assert.Equal(t, "scripted", m.ID)
	am, err := ac.Models.Get(ctx, "scripted", anthropic.ModelGetParams{})
	require.NoError(t, err)
	assert.Equal(t, "scripted", am.ID)

	_, err = oc.Models.Get(ctx, "gpt-other")
	var oerr *openai.Error
	require.ErrorAs(t, err, &oerr)
	assert.Equal(t, http.StatusNotFound, oerr.StatusCode)
	_, err = ac.Models.Get(ctx, "claude-other", anthropic.ModelGetParams{})
	var aerr *anthropic.Error
	require.ErrorAs(t, err, &aerr)
	assert.Equal(t, http.StatusNotFound, aerr.StatusCode)
	assert.Equal(t, "not_found_error", string(aerr.Type()))
}

// startScriptedTrace runs a gateway on sdkScript with m's budgets.
func startScriptedTrace(t *testing.T, m config.ModelEntry) (*Gateway, *http.Client, interface{ String() string }) {
	t.Helper()
	script := filepath.Join(t.TempDir(), "s.jsonl")
	require.NoError(t, os.WriteFile(script, []byte(sdkScript), 0o644))
	m.Provider, m.Name = config.ProviderScripted, script
	return startConfig(t, Config{Model: m})
}

// Answers of a fake OpenAI Responses upstream, as the API writes them.
const (
	responsesBody = `{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"gpt-test","output":[` +
		`{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello there","annotations":[]}]},` +
		`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"list_dir","arguments":"{\"path\":\".\"}","status":"completed"}],` +
		`"usage":{"input_tokens":31,"input_tokens_details":{"cached_tokens":8},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":40}}`
	responsesStream = "event: response.created\n" +
		`data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_2","object":"response","created_at":1,"status":"in_progress","model":"gpt-test","output":[],"usage":null}}` + "\n\n" +
		"event: response.output_item.added\n" +
		`data: {"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"type":"message","id":"msg_2","status":"in_progress","role":"assistant","content":[]}}` + "\n\n" +
		"event: response.content_part.added\n" +
		`data: {"type":"response.content_part.added","sequence_number":2,"item_id":"msg_2","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}` + "\n\n" +
		"event: response.output_text.delta\n" +
		`data: {"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_2","output_index":0,"content_index":0,"delta":"Hel","logprobs":[]}` + "\n\n" +
		"event: response.output_text.delta\n" +
		`data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_2","output_index":0,"content_index":0,"delta":"lo","logprobs":[]}` + "\n\n" +
		"event: response.output_text.done\n" +
		`data: {"type":"response.output_text.done","sequence_number":5,"item_id":"msg_2","output_index":0,"content_index":0,"text":"Hello","logprobs":[]}` + "\n\n" +
		"event: response.output_item.done\n" +
		`data: {"type":"response.output_item.done","sequence_number":6,"output_index":0,"item":{"type":"message","id":"msg_2","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]}]}}` + "\n\n" +
		"event: response.completed\n" +
		`data: {"type":"response.completed","sequence_number":7,"response":{"id":"resp_2","object":"response","created_at":1,"status":"completed","model":"gpt-test","output":[{"type":"message","id":"msg_2","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]}]}],` +
		`"usage":{"input_tokens":44,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":46}}}` + "\n\n"
)

// Answers of a fake Anthropic Messages upstream, as the API writes them.
const (
	messagesBody = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"Hi"},` +
		`{"type":"tool_use","id":"toolu_1","name":"list_dir","input":{"path":"."}}],"stop_reason":"tool_use","stop_sequence":null,` +
		`"usage":{"input_tokens":25,"cache_creation_input_tokens":10,"cache_read_input_tokens":100,"output_tokens":12}}`
	messagesStream = "event: message_start\n" +
		`data: {"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","content":[],"model":"claude-test","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":10,"cache_read_input_tokens":100,"output_tokens":1}}}` + "\n\n" +
		"event: content_block_start\n" +
		`data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
		"event: ping\n" + `data: {"type": "ping"}` + "\n\n" +
		"event: content_block_delta\n" +
		`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}` + "\n\n" +
		"event: content_block_delta\n" +
		`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}` + "\n\n" +
		"event: content_block_stop\n" + `data: {"type":"content_block_stop","index":0}` + "\n\n" +
		"event: content_block_start\n" +
		`data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_2","name":"list_dir","input":{}}}` + "\n\n" +
		"event: content_block_delta\n" +
		`data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"path\":"}}` + "\n\n" +
		"event: content_block_delta\n" +
		`data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\".\"}"}}` + "\n\n" +
		"event: content_block_stop\n" + `data: {"type":"content_block_stop","index":1}` + "\n\n" +
		"event: message_delta\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":15}}` + "\n\n" +
		"event: message_stop\n" + `data: {"type":"message_stop"}` + "\n\n"
)

// upstreamSeen is what a fake upstream received.
type upstreamSeen struct {
	path   string
	header http.Header
	body   map[string]any
}

// fakeUpstream answers path with body or, when the request asks to
// stream, with the event stream, recording each request.
func fakeUpstream(t *testing.T, path, body, stream string) (*httptest.Server, chan upstreamSeen) {
	seen := make(chan upstreamSeen, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		_ = json.NewDecoder(r.Body).Decode(&req)
		seen <- upstreamSeen{path: r.URL.Path, header: r.Header.Clone(), body: req}
		if r.URL.Path != path {
			http.Error(w, `{"error":{"message":"no such path"}}`, http.StatusNotFound)
			return
		}
		if req["stream"] == true {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, stream)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, seen
}

func TestOpenAISDKResponsesThroughFakeUpstream(t *testing.T) {
	up, seen := fakeUpstream(t, "/v1/responses", responsesBody, responsesStream)
	g, _, trace := startConfig(t, Config{Model: openAIModel(t, up.URL+"/v1")})
	client := openAIClient(g, 0)
	ctx := context.Background()
	params := responses.ResponseNewParams{Model: "gpt-expensive", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}

	resp, err := client.Responses.New(ctx, params)
	require.NoError(t, err)
	assert.Equal(t, "Hello there", resp.OutputText())
	got := <-seen
	assert.Equal(t, "Bearer "+testKey, got.header.Get("Authorization"), "the host's key replaces the agent's")
	assert.Equal(t, "gpt-test", got.body["model"])

	stream := client.Responses.NewStreaming(ctx, params)
	var acc responses.ResponseAccumulator
	for stream.Next() {
		var ev responses.ResponsesServerEventUnion
		require.NoError(t, json.Unmarshal([]byte(stream.Current().RawJSON()), &ev))
		require.NoError(t, acc.AddEvent(ev))
	}
	require.NoError(t, stream.Err())
	assert.Equal(t, "Hello", acc.Snapshot().OutputText())
	got = <-seen
	assert.Equal(t, true, got.body["stream"])

	require.NoError(t, g.Close())
	assert.Equal(t, Usage{PromptTokens: 31 + 44, CompletionTokens: 9 + 2, Requests: 2, CacheReadTokens: 8}, g.Usage(), "tokens metered are the upstream's usage")
	assert.NotContains(t, trace.String(), testKey)
	assert.Contains(t, trace.String(), `"api":"responses"`)
}

func TestAnthropicSDKMessagesThroughFakeUpstream(t *testing.T) {
	up, seen := fakeUpstream(t, "/v1/messages", messagesBody, messagesStream)
	t.Setenv("TEST_GATEWAY_KEY", testKey)
	g, _, trace := startConfig(t, Config{Model: config.ModelEntry{Provider: config.ProviderAnthropic, Name: "claude-test", BaseURL: up.URL + "/v1", APIKeyEnv: "TEST_GATEWAY_KEY"}})
	client := anthropicClient(g, 0)
	ctx := context.Background()
	params := anthropic.MessageNewParams{
		Model: "claude-expensive", MaxTokens: 512,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	}

	msg, err := client.Messages.New(ctx, params, aoption.WithHeader("anthropic-beta", "some-feature-2025-01-01"), aoption.WithHeader("Authorization", "Bearer "+agentKey))
	require.NoError(t, err)
	require.Len(t, msg.Content, 2)
	assert.Equal(t, "Hi", msg.Content[0].Text)
	got := <-seen
	assert.Equal(t, testKey, got.header.Get("x-api-key"), "the host's key replaces the agent's")
	assert.Equal(t, AnthropicVersion, got.header.Get("anthropic-version"))
	assert.Empty(t, got.header.Get("Authorization"), "agent-supplied auth headers are stripped")
	assert.Equal(t, "some-feature-2025-01-01", got.header.Get("anthropic-beta"))
	assert.Equal(t, "claude-test", got.body["model"])

	stream := client.Messages.NewStreaming(ctx, params)
	acc := anthropic.Message{}
	for stream.Next() {
		require.NoError(t, acc.Accumulate(stream.Current()))
	}
	require.NoError(t, stream.Err())
	require.Len(t, acc.Content, 2)
	assert.Equal(t, "Hello", acc.Content[0].Text)
	assert.JSONEq(t, `{"path":"."}`, string(acc.Content[1].Input))
	assert.Equal(t, int64(15), acc.Usage.OutputTokens)
	<-seen

	require.NoError(t, g.Close())
	// Anthropic's input_tokens exclude the cache: the prompt is all three.
	assert.Equal(t, Usage{PromptTokens: 2 * (25 + 10 + 100), CompletionTokens: 12 + 15, Requests: 2, CacheReadTokens: 200, CacheWriteTokens: 20}, g.Usage())
	assert.NotContains(t, trace.String(), testKey)
	assert.NotContains(t, trace.String(), agentKey)
}

func TestSDKsDoNotRetryBudgetRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("openai", func(t *testing.T) {
		g, _, trace := startScriptedTrace(t, config.ModelEntry{MaxRequests: 1})
		client := openAIClient(g, 3)
		params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
		_, err := client.Chat.Completions.New(ctx, params)
		require.NoError(t, err)
		_, err = client.Chat.Completions.New(ctx, params)
		var apiErr *openai.Error
		require.ErrorAs(t, err, &apiErr)
		assert.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
		assert.Equal(t, codeBudget, apiErr.Type)
		assert.Contains(t, apiErr.Message, "max_requests=1")
		assert.Equal(t, 2, recordLines(trace), "the refused request reached the gateway once: no retries")
	})
	t.Run("anthropic", func(t *testing.T) {
		g, _, trace := startScriptedTrace(t, config.ModelEntry{MaxRequests: 1})
		client := anthropicClient(g, 3)
		params := anthropic.MessageNewParams{Model: "m", MaxTokens: 100, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
		_, err := client.Messages.New(ctx, params)
		require.NoError(t, err)
		_, err = client.Messages.New(ctx, params)
		var apiErr *anthropic.Error
		require.ErrorAs(t, err, &apiErr)
		assert.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
		assert.Equal(t, "rate_limit_error", string(apiErr.Type()))
		assert.Contains(t, apiErr.Message, "max_requests=1")
		assert.Equal(t, 2, recordLines(trace), "the refused request reached the gateway once: no retries")
	})
}

func TestSDKsParseGatewayErrors(t *testing.T) {
	ctx := context.Background()
	g, _, trace := startScriptedTrace(t, config.ModelEntry{})
	oc := openAIClient(g, 0)
	_, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "m", N: openai.Int(100), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var oerr *openai.Error
	require.ErrorAs(t, err, &oerr)
	assert.Equal(t, http.StatusBadRequest, oerr.StatusCode)
	assert.Equal(t, codeInvalidRequest, oerr.Type)
	assert.Contains(t, oerr.Message, "n=100")

	// A Messages request to a run whose model speaks only OpenAI's APIs.
	up, _ := fakeUpstream(t, "/v1/chat/completions", "{}", "")
	g2, _, _ := startConfig(t, Config{Model: openAIModel(t, up.URL+"/v1")})
	ac := anthropicClient(g2, 0)
	_, err = ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "m", MaxTokens: 10, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	var aerr *anthropic.Error
	require.ErrorAs(t, err, &aerr)
	assert.Equal(t, http.StatusNotFound, aerr.StatusCode)
	assert.Equal(t, "not_found_error", string(aerr.Type()))
	assert.Contains(t, aerr.Message, "POST /v1/chat/completions")
	assert.Equal(t, 0, g.Usage().Requests, "a refused request is not metered")
	assert.Contains(t, trace.String(), `"status":400`)
}
