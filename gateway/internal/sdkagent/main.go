// Command sdkagent is a minimal agent built on the official OpenAI and
// Anthropic Go SDKs, configured only by their environment variables
// (OPENAI_BASE_URL, ANTHROPIC_BASE_URL and their keys). It streams one
// answer from each API the gateway serves (chat completions, Responses,
// Messages), each offering a tool, and prints per API one JSON line with the
// text, the tool calls and the usage the SDK accumulated. Tests run it
// inside a sandbox, behind taskrun-relay.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

// Result is what one API answered.
type Result struct {
	API          string   `json:"api"`
	Text         string   `json:"text"`
	ToolCalls    []string `json:"tool_calls"`
	InputTokens  int64    `json:"input_tokens"`
	OutputTokens int64    `json:"output_tokens"`
}

var schema = map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}}

func main() {
	ctx := context.Background()
	failed := false
	for _, run := range []func(context.Context) (Result, error){chat, responsesAPI, messages} {
		res, err := run(ctx)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sdkagent: %s: %v\n", res.API, err)
			failed = true
			continue
		}
		line, _ := json.Marshal(res)
		fmt.Println(string(line))
	}
	if failed {
		os.Exit(1)
	}
}

// chat streams a chat completion and accumulates it.
func chat(ctx context.Context) (Result, error) {
	res := Result{API: "chat.completions"}
	client := openai.NewClient()
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "any",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("look around")},
		Tools:         []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "list_dir", Parameters: schema})},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		return res, err
	}
	if len(acc.Choices) == 0 {
		return res, fmt.Errorf("no choices")
	}
	res.Text = acc.Choices[0].Message.Content
	for _, tc := range acc.Choices[0].Message.ToolCalls {
		res.ToolCalls = append(res.ToolCalls, tc.Function.Name+" "+tc.Function.Arguments)
	}
	res.InputTokens, res.OutputTokens = acc.Usage.PromptTokens, acc.Usage.CompletionTokens
	return res, nil
}

// responsesAPI streams a Responses API answer.
func responsesAPI(ctx context.Context) (Result, error) {
	res := Result{API: "responses"}
	client := openai.NewClient()
	stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: "any",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("look around")},
		Tools: []responses.ToolUnionParam{responses.ToolParamOfFunction("list_dir", schema, false)},
	})
	var text strings.Builder
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.AsResponseOutputTextDelta().Delta)
		case "response.output_item.done":
			if item := ev.AsResponseOutputItemDone().Item; item.Type == "function_call" {
				call := item.AsFunctionCall()
				res.ToolCalls = append(res.ToolCalls, call.Name+" "+call.Arguments)
			}
		case "response.completed":
			u := ev.AsResponseCompleted().Response.Usage
			res.InputTokens, res.OutputTokens = u.InputTokens, u.OutputTokens
		}
	}
	res.Text = text.String()
	return res, stream.Err()
}

// messages streams an Anthropic Messages answer and accumulates it.
func messages(ctx context.Context) (Result, error) {
	res := Result{API: "messages"}
	client := anthropic.NewClient()
	stream := client.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
		Model:     "any",
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("look around"))},
		Tools:     []anthropic.ToolUnionParam{anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{Properties: schema["properties"]}, "list_dir")},
	})
	msg := anthropic.Message{}
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			return res, err
		}
	}
	if err := stream.Err(); err != nil {
		return res, err
	}
	for _, block := range msg.Content {
		switch block.Type {
		case "text":
			res.Text += block.Text
		case "tool_use":
			res.ToolCalls = append(res.ToolCalls, block.Name+" "+string(block.Input))
		}
	}
	u := msg.Usage
	res.InputTokens, res.OutputTokens = u.InputTokens+u.CacheCreationInputTokens+u.CacheReadInputTokens, u.OutputTokens
	return res, nil
}
