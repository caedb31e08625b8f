package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/examples"
	"github.com/taskrun/taskrun/gateway"
)

// demoRunDir lays out a run dir holding the demo workspace and prompt.
func demoRunDir(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.CopyFS(filepath.Join(root, "home"), examples.DemoWorkspace()))
	require.NoError(t, os.WriteFile(filepath.Join(root, "AGENTS.md"), []byte("# Run\nWork in /taskrun/home.\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "prompt.txt"), []byte(examples.DemoPrompt), 0o644))
	return root
}

// startDemoGateway serves the demo script on a socket in root and returns
// the socket path and the gateway's trace.
func startDemoGateway(t *testing.T, root string) (string, *bytes.Buffer) {
	t.Helper()
	var trace bytes.Buffer
	sock := filepath.Join(root, ".gateway", "model.sock")
	g, err := gateway.Start(context.Background(), gateway.Config{
		SocketPath: sock,
		Model:      config.ModelEntry{Provider: config.ProviderScripted, Name: gateway.DemoScriptName},
		Trace:      &trace,
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })
	return sock, &trace
}

func runAgent(t *testing.T, root, sock, runID string) string {
	t.Helper()
	env := envFor(map[string]string{"TASKRUN_RUN_ID": runID, "TASKRUN_SESSION_ID": "sess1", "TASKRUN_MODEL_SOCKET": sock, "TASKRUN_MODEL": "scripted"})
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"-root", root}, env, &out), "agent output:\n%s", out.String())
	return out.String()
}

func TestModelLoopDoesTheDemoTask(t *testing.T) {
	root := demoRunDir(t)
	sock, _ := startDemoGateway(t, root)
	out := runAgent(t, root, sock, "run1")

	assert.Contains(t, out, "I'll start by looking at the workspace.", "assistant text is streamed to stdout")
	assert.Contains(t, out, "[tool] list_dir")
	assert.Contains(t, out, "[tool] read_file")
	assert.Contains(t, out, "[tool] write_file")

	greet, err := os.ReadFile(filepath.Join(root, "home", "greet.go"))
	require.NoError(t, err)
	assert.Contains(t, string(greet), `fmt.Sprintf("Hello, %s!", name)`)
	assert.NotContains(t, string(greet), "TODO")
	notes, err := os.ReadFile(filepath.Join(root, "home", "notes.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(notes), "[x] greet.go")
	assert.FileExists(t, filepath.Join(root, "home", "CHANGELOG.md"))
	report, err := os.ReadFile(filepath.Join(root, "artifacts", "report.md"))
	require.NoError(t, err, "/taskrun/artifacts maps to the configured artifacts dir")
	assert.Contains(t, string(report), "# Report: greeter TODO")
	result, err := os.ReadFile(filepath.Join(root, "output", "result.md"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(result), "Done. `Greet` now greets by name"), "result: %s", result)

	events := readTrace(t, filepath.Join(root, "global", "traces", "sess1", "rt_run1.jsonl"))
	names := eventNames(events)
	for _, want := range []string{"run_start", "model_request", "model_response", "tool_call", "tool_result", "result_written", "run_end"} {
		assert.Contains(t, names, want)
	}
	assert.Equal(t, 7, count(names, "model_request"), "one request per script line")
}

func TestModelLoopResumesConversation(t *testing.T) {
	root := demoRunDir(t)
	sock, _ := startDemoGateway(t, root)
	runAgent(t, root, sock, "run1")
	require.NoError(t, os.Remove(filepath.Join(root, "output", "result.md")))

	// The second run gets a fresh gateway (one per run) and the same home.
	sock2, gwTrace := startDemoGateway(t, filepath.Join(root, "run2"))
	out := runAgent(t, root, sock2, "run2")
	assert.Contains(t, out, "resuming session sess1")

	events := readTrace(t, filepath.Join(root, "global", "traces", "sess1", "rt_run2.jsonl"))
	var resumed *traceEvent
	for i := range events {
		if events[i].Event == "conversation_resumed" {
			resumed = &events[i]
		}
	}
	require.NotNil(t, resumed, "run 2's trace shows the resumed conversation")
	assert.Equal(t, []any{"run1"}, resumed.Data["previous_runs"])
	prior, err := json.Marshal(resumed.Data["messages"])
	require.NoError(t, err)
	assert.Contains(t, string(prior), "Done. `Greet` now greets by name", "run 1's final answer is in the resumed history")

	// The model itself was sent run 1's messages on run 2's first request.
	firstLine, _, _ := strings.Cut(gwTrace.String(), "\n")
	var x struct {
		Request struct {
			Messages []message `json:"messages"`
		} `json:"request"`
	}
	require.NoError(t, json.Unmarshal([]byte(firstLine), &x))
	require.Greater(t, len(x.Request.Messages), 10)
	assert.Contains(t, x.Request.Messages[len(x.Request.Messages)-1].Content, "A new run of this session (run2)")

	conv, err := loadConversation(filepath.Join(root, "home", ".taskrun-agent"))
	require.NoError(t, err)
	assert.Equal(t, []string{"run1", "run2"}, conv.Runs)
	assert.FileExists(t, filepath.Join(root, "output", "result.md"))
}

func TestToolsStayInsideTheirDirectories(t *testing.T) {
	root := demoRunDir(t)
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("s3cr3t"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "home", "link")))
	c, err := parseConfig([]string{"-root", root, "-run-id", "r"}, envFor(nil))
	require.NoError(t, err)
	tb, err := newToolbox(c)
	require.NoError(t, err)
	defer tb.Close()
	ctx := context.Background()

	for _, args := range []string{
		`{"path":"../AGENTS.md"}`, `{"path":"/taskrun/global/x"}`, `{"path":"/etc/passwd"}`,
		`{"path":"link"}`, `{"path":"/taskrun/home/../prompt.txt"}`, `{"path":"` + filepath.Join(outside, "secret") + `"}`,
	} {
		_, err := tb.call(ctx, "read_file", args)
		require.Error(t, err, "read_file %s", args)
	}
	_, err = tb.call(ctx, "write_file", `{"path":"../escape.txt","content":"x"}`)
	require.ErrorIs(t, err, errOutsideWorkspace)
	assert.NoFileExists(t, filepath.Join(root, "escape.txt"))
	_, err = tb.call(ctx, "write_file", `{"path":"link","content":"overwritten"}`)
	require.Error(t, err, "writing through a symlink out of home fails")
	secret, err := os.ReadFile(filepath.Join(outside, "secret"))
	require.NoError(t, err)
	assert.Equal(t, "s3cr3t", string(secret))

	got, err := tb.call(ctx, "write_file", `{"path":"/taskrun/output/sub/a.txt","content":"ok"}`)
	require.NoError(t, err)
	assert.Contains(t, got, "wrote 2 bytes")
	assert.FileExists(t, filepath.Join(root, "output", "sub", "a.txt"))
	listing, err := tb.call(ctx, "list_dir", `{"path":"/taskrun/home"}`)
	require.NoError(t, err)
	assert.Contains(t, listing, "greet.go (")
	_, err = fs.Stat(os.DirFS(root), "home/README.md")
	require.NoError(t, err)
}

func TestRunCommandIsConfinedAndBounded(t *testing.T) {
	root := demoRunDir(t)
	c, err := parseConfig([]string{"-root", root, "-run-id", "r", "-command-timeout", "300ms"}, envFor(nil))
	require.NoError(t, err)
	tb, err := newToolbox(c)
	require.NoError(t, err)
	defer tb.Close()
	if tb.shell == "" {
		t.Skip("no /bin/sh on this machine")
	}
	got, err := tb.call(context.Background(), "run_command", `{"command":"pwd; cat notes.txt; exit 3"}`)
	require.NoError(t, err)
	assert.Contains(t, got, "exit code 3")
	assert.Contains(t, got, filepath.Join(root, "home"))
	assert.Contains(t, got, "Open items")
	got, err = tb.call(context.Background(), "run_command", `{"command":"sleep 30 & sleep 30"}`)
	require.NoError(t, err)
	assert.Contains(t, got, "timed out")

	c.Shell = filepath.Join(root, "no-such-shell")
	noShell, err := newToolbox(c)
	require.NoError(t, err)
	defer noShell.Close()
	for _, s := range noShell.specs() {
		assert.NotEqual(t, "run_command", s.Function.Name, "run_command is offered only with a shell")
	}
	_, err = noShell.call(context.Background(), "run_command", `{"command":"true"}`)
	require.Error(t, err)
}

func count(items []string, want string) int {
	n := 0
	for _, s := range items {
		if s == want {
			n++
		}
	}
	return n
}
