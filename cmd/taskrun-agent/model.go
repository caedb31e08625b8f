package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// errTooManyTurns is returned when the model never gives a final answer.
var errTooManyTurns = errors.New("no final answer within the turn limit")

// conversationFile holds the conversation across resumed runs.
const conversationFile = "conversation.json"

// conversation is the saved chat: every message of every run of the session.
type conversation struct {
	SessionID string    `json:"session_id"`
	Runs      []string  `json:"runs"`
	Messages  []message `json:"messages"`
}

// loadConversation reads the saved conversation; none is an empty one.
func loadConversation(dir string) (conversation, error) {
	var conv conversation
	data, err := os.ReadFile(filepath.Join(dir, conversationFile))
	if errors.Is(err, fs.ErrNotExist) {
		return conv, nil
	}
	if err != nil {
		return conv, fmt.Errorf("read conversation: %w", err)
	}
	if err := json.Unmarshal(data, &conv); err != nil {
		return conv, fmt.Errorf("parse conversation %s (delete it to start over): %w", filepath.Join(dir, conversationFile), err)
	}
	return conv, nil
}

// systemPrompt introduces the agent's situation and the run's AGENTS.md.
func systemPrompt(agentsMD string, tools []toolSpec) string {
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Function.Name
	}
	return fmt.Sprintf(`You are taskrun's reference agent, working inside a sandbox without network.
Your workspace is %s (relative paths are resolved there). Put deliverables in %s.
Your tools: %s. When the task is done, answer with a short summary and no tool calls: that answer is the run's result.

%s`, homePath, artifactsPath, strings.Join(names, ", "), agentsMD)
}

// runModel runs the tool-using loop against the model gateway, continuing
// the saved conversation when the session is resumed.
func runModel(ctx context.Context, c agentConfig, out io.Writer, tr *tracer) error {
	tools, err := newToolbox(c)
	if err != nil {
		return err
	}
	defer tools.Close()
	session, err := loadSession(c.stateDir())
	if err != nil {
		return err
	}
	if _, err := recordRun(c.stateDir(), session, c, "model"); err != nil {
		return err
	}
	conv, err := startConversation(c, tools, tr, out)
	if err != nil {
		return err
	}
	client := newChatClient(c.ModelSocket, c.Model)
	for turn := 1; turn <= c.MaxTurns; turn++ {
		final, done, err := step(ctx, c, client, tools, &conv, turn, out, tr)
		if err != nil {
			return err
		}
		if done {
			return finish(c, final, out, tr)
		}
	}
	return fmt.Errorf("%w (%d turns): raise -max-turns or simplify the task", errTooManyTurns, c.MaxTurns)
}

// startConversation loads the session's conversation, or starts one, and
// adds this run's task to it.
func startConversation(c agentConfig, tools *toolbox, tr *tracer, out io.Writer) (conversation, error) {
	conv, err := loadConversation(c.stateDir())
	if err != nil {
		return conv, err
	}
	prompt := strings.TrimSpace(readOptional(c.PromptFile))
	if len(conv.Messages) == 0 {
		conv.SessionID = c.SessionID
		conv.Messages = []message{
			{Role: "system", Content: systemPrompt(readOptional(c.AgentsMD), tools.specs())},
			{Role: "user", Content: prompt},
		}
	} else {
		tr.Event("conversation_resumed", map[string]any{"previous_runs": conv.Runs, "messages": conv.Messages})
		fmt.Fprintf(out, "[taskrun-agent] resuming session %s: %d messages from run(s) %s\n", c.SessionID, len(conv.Messages), strings.Join(conv.Runs, ", "))
		conv.Messages = append(conv.Messages, message{Role: "user", Content: "A new run of this session (" + c.RunID + ") starts. Task:\n" + prompt})
	}
	conv.Runs = append(conv.Runs, c.RunID)
	return conv, saveConversation(c, conv)
}

func saveConversation(c agentConfig, conv conversation) error {
	return writeJSON(filepath.Join(c.stateDir(), conversationFile), conv)
}

// step asks the model once and runs the tools it calls. It reports the
// final answer when the model called no tools.
func step(ctx context.Context, c agentConfig, client *chatClient, tools *toolbox, conv *conversation, turn int, out io.Writer, tr *tracer) (string, bool, error) {
	tr.Event("model_request", map[string]any{"turn": turn, "messages": len(conv.Messages), "last": conv.Messages[len(conv.Messages)-1]})
	msg, u, err := client.complete(ctx, conv.Messages, tools.specs(), out)
	if err != nil {
		tr.Event("model_error", map[string]any{"turn": turn, "error": err.Error()})
		return "", false, err
	}
	if msg.Content != "" && !strings.HasSuffix(msg.Content, "\n") {
		fmt.Fprintln(out)
	}
	tr.Event("model_response", map[string]any{"turn": turn, "message": msg, "usage": u})
	conv.Messages = append(conv.Messages, msg)
	if len(msg.ToolCalls) == 0 {
		return msg.Content, true, saveConversation(c, *conv)
	}
	for _, tc := range msg.ToolCalls {
		conv.Messages = append(conv.Messages, runTool(ctx, tools, tc, out, tr))
	}
	return "", false, saveConversation(c, *conv)
}

// runTool runs one tool call and returns the tool message for the model.
func runTool(ctx context.Context, tools *toolbox, tc toolCall, out io.Writer, tr *tracer) message {
	fmt.Fprintf(out, "[tool] %s %s\n", tc.Function.Name, abbreviate(tc.Function.Arguments, 120))
	tr.Event("tool_call", map[string]any{"id": tc.ID, "name": tc.Function.Name, "arguments": tc.Function.Arguments})
	result, err := tools.call(ctx, tc.Function.Name, tc.Function.Arguments)
	if err != nil {
		result = "error: " + err.Error()
	}
	fmt.Fprintf(out, "[tool] -> %s\n", abbreviate(result, 160))
	tr.Event("tool_result", map[string]any{"id": tc.ID, "name": tc.Function.Name, "ok": err == nil, "result": abbreviate(result, 4096)})
	return message{Role: "tool", ToolCallID: tc.ID, Content: result}
}

// finish writes the final answer to the result file.
func finish(c agentConfig, final string, out io.Writer, tr *tracer) error {
	if err := writeFileAtomic(c.resultPath(), []byte(strings.TrimSpace(final)+"\n")); err != nil {
		return err
	}
	tr.Event("result_written", map[string]any{"path": c.resultPath(), "bytes": len(final)})
	fmt.Fprintf(out, "[taskrun-agent] final answer written to %s\n", filepath.Join(outputPath, "result.md"))
	return nil
}

// abbreviate shortens s to n bytes on one line for display.
func abbreviate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
