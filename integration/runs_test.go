package integration_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/examples"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
)

// demoScript is what the scripted demo model will answer, line by line.
type demoScript struct {
	requests         int
	promptTokens     int
	completionTokens int
	// report is the artifact the script has the agent write.
	report string
	// finalAnswer is the script's last message.
	finalAnswer string
}

func loadDemoScript(t *testing.T) demoScript {
	t.Helper()
	lines, err := gateway.ParseScript(bytes.NewReader(examples.DemoScript))
	require.NoError(t, err)
	var s demoScript
	for _, l := range lines {
		s.requests++
		s.promptTokens += l.Usage.PromptTokens
		s.completionTokens += l.Usage.CompletionTokens
		for _, tc := range l.ToolCalls {
			var args struct{ Path, Content string }
			require.NoError(t, json.Unmarshal(tc.Arguments, &args))
			if tc.Name == "write_file" && args.Path == "/taskrun/artifacts/report.md" {
				s.report = args.Content
			}
		}
		s.finalAnswer = l.Content
	}
	require.NotEmpty(t, s.report, "the demo script writes artifacts/report.md")
	return s
}

// The reference agent runs the demo against the scripted model: the S3
// store holds its report, output, trace and session; the control plane saw
// RUNNING then SUCCEEDED with the metered tokens, the trace and the artifact.
func TestAgentRunSucceeds(t *testing.T) {
	h := newHarness(t)
	script := loadDemoScript(t)
	const runID = "agent-ok"
	h.run(h.agentRun(runID))

	// Control plane: the status story.
	ps := h.patches(runID)
	assert.Equal(t, model.StatusRunning, ps[0].Status)
	require.NotNil(t, ps[0].Container)
	assert.NotEmpty(t, ps[0].Container.ID)
	final := ps[len(ps)-1]
	require.Equal(t, model.StatusSucceeded, final.Status, "error: %v", final.Error)
	require.NotNil(t, final.ExitCode)
	assert.Equal(t, 0, *final.ExitCode)
	require.NotNil(t, final.PromptTokens)
	require.NotNil(t, final.CompletionTokens)
	assert.Equal(t, script.promptTokens, *final.PromptTokens, "tokens are the gateway's metering of the script")
	assert.Equal(t, script.completionTokens, *final.CompletionTokens)

	// Output: streamed bytes, stored log and PATCHed output agree.
	stream := h.stream(runID)
	assert.Contains(t, string(stream), strings.TrimSpace(script.finalAnswer))
	assert.Equal(t, stream, h.runObject(runID, taskrun.OutputLogName))
	require.NotNil(t, final.Output)
	assert.Equal(t, string(stream), *final.Output)

	// The artifact: stored bytes are the script's report, and the PATCH
	// names them by key, size and digest.
	reportKey, err := persist.ArtifactKey(h.Ref(runID), "report.md")
	require.NoError(t, err)
	report := h.object(reportKey)
	assert.Equal(t, script.report, string(report))
	require.NotNil(t, final.Artifact)
	assert.Equal(t, reportKey, final.Artifact.Key)
	assert.EqualValues(t, len(report), final.Artifact.Size)
	sum := sha256.Sum256(report)
	assert.Equal(t, hex.EncodeToString(sum[:]), final.Artifact.SHA256)

	// The trace: agent events and one gateway exchange per model request.
	require.NotNil(t, final.TracePath)
	assert.Equal(t, "traces/"+sessionID+"/rt_"+runID+".jsonl", *final.TracePath)
	traceKey, err := persist.GlobalKey(h.Tenant, *final.TracePath)
	require.NoError(t, err)
	lines := parseTrace(t, h.object(traceKey))
	events, exchanges := 0, 0
	for _, l := range lines {
		switch {
		case l.Seq != nil:
			exchanges++
		case l.Event != "":
			events++
		}
	}
	assert.Equal(t, script.requests, exchanges, "one gateway exchange per scripted response")
	assert.Greater(t, events, script.requests, "the agent traced its own steps")

	// The final answer and the session state with the agent's edits.
	assert.Contains(t, string(h.runObject(runID, taskrun.ResultPrefix+"result.md")), strings.TrimSpace(script.finalAnswer))
	home := untar(t, h.runObject(runID, taskrun.SessionStateName))
	assert.NotContains(t, home["greet.go"], "TODO")
	assert.Contains(t, home["greet.go"], `fmt.Sprintf("Hello, %s!", name)`)
	assert.Contains(t, home, "CHANGELOG.md")
}

// An agent that fails: FAILED with its exit code and reason, and the partial
// output still stored and streamed.
func TestAgentFailureIsReportedAndPartialOutputKept(t *testing.T) {
	h := newHarness(t)
	const runID = "agent-fails"
	h.run(h.shellRun(runID, "echo x; exit 7"))

	final := h.final(runID)
	assert.Equal(t, model.StatusFailed, final.Status)
	require.NotNil(t, final.ExitCode)
	assert.Equal(t, 7, *final.ExitCode)
	require.NotNil(t, final.Error)
	assert.Equal(t, "agent exited with code 7", *final.Error)
	assert.Equal(t, "x\n", string(h.stream(runID)))
	assert.Equal(t, "x\n", string(h.runObject(runID, taskrun.OutputLogName)))
	assert.Contains(t, h.keys(), h.runKey(runID, taskrun.SessionStateName), "the session state is kept for a retry")
}

// A run past its timeout is stopped: FAILED as timed out, with what it
// printed before stored and streamed.
func TestTimeoutStopsTheRun(t *testing.T) {
	h := newHarness(t)
	const runID = "too-slow"
	in := h.shellRun(runID, "echo started; sleep 600")
	in.Timeout = 2 * time.Second
	h.run(in)

	final := h.final(runID)
	assert.Equal(t, model.StatusFailed, final.Status)
	require.NotNil(t, final.Error)
	assert.Contains(t, *final.Error, "timed out")
	require.NotNil(t, final.StartedAt)
	require.NotNil(t, final.EndedAt)
	assert.Less(t, *final.EndedAt-*final.StartedAt, int64(time.Minute/time.Millisecond), "stopped long before the command would have ended")
	assert.Equal(t, "started\n", string(h.stream(runID)))
	assert.Equal(t, "started\n", string(h.runObject(runID, taskrun.OutputLogName)))
}

// A second run resumes the first: it starts from the first run's files and
// the agent continues the same conversation with the model.
func TestResumeContinuesTheSession(t *testing.T) {
	h := newHarness(t)
	script := loadDemoScript(t)
	h.run(h.agentRun("first"))
	require.Equal(t, model.StatusSucceeded, h.final("first").Status, "error: %v", h.final("first").Error)

	in := h.agentRun("second")
	in.Task.WorkspaceDir = "" // everything comes from the first run's session
	in.Task.Prompt = "Check that the greeter fix is still in place."
	in.Run.PreviousRunID = "first"
	h.run(in)
	final := h.final("second")
	require.Equal(t, model.StatusSucceeded, final.Status, "error: %v", final.Error)
	assert.Contains(t, string(h.stream("second")), "resuming session "+sessionID)

	traceKey, err := persist.GlobalKey(h.Tenant, *final.TracePath)
	require.NoError(t, err)
	lines := parseTrace(t, h.object(traceKey))

	// The agent resumed the conversation of run "first".
	var resumed struct {
		PreviousRuns []string `json:"previous_runs"`
	}
	var firstRequest struct {
		Messages []struct{ Role, Content string } `json:"messages"`
	}
	var notes []string
	for _, l := range lines {
		switch {
		case l.Event == "conversation_resumed":
			require.NoError(t, json.Unmarshal(l.Data, &resumed))
		case l.Seq != nil && firstRequest.Messages == nil:
			require.NoError(t, json.Unmarshal(l.Request, &firstRequest))
		case l.Event == "tool_result" && bytes.Contains(l.Data, []byte(`"name":"read_file"`)) && bytes.Contains(l.Data, []byte("Open items")):
			notes = append(notes, string(l.Data))
		}
	}
	assert.Equal(t, []string{"first"}, resumed.PreviousRuns)

	// The model was sent the first run's conversation, final answer included.
	var history strings.Builder
	for _, m := range firstRequest.Messages {
		history.WriteString(m.Content)
	}
	assert.Contains(t, history.String(), strings.TrimSpace(script.finalAnswer))
	assert.Contains(t, history.String(), "Check that the greeter fix is still in place.")

	// The second run read the notes as the first run left them.
	require.NotEmpty(t, notes, "the second run read notes.txt")
	assert.Contains(t, notes[0], `[x] greet.go`)

	// Its stored session holds both runs of the conversation.
	home := untar(t, h.runObject("second", taskrun.SessionStateName))
	var conv struct {
		Runs []string `json:"runs"`
	}
	require.NoError(t, json.Unmarshal([]byte(home[".taskrun-agent/conversation.json"]), &conv))
	assert.Equal(t, []string{"first", "second"}, conv.Runs)
}
