package taskrun_test

// Tests named for the seed's statements about RunTask, RunResult,
// RuntimePaths, TaskRunUpdater and AGENTS.md. Statements covered by a larger
// scenario name it here:
//
//   - "RunTask materializes the workspace, runs the agent in a sandbox,
//     persists outputs and run state, and updates the run via the updater":
//     TestRunTaskSucceededPersistsEverythingAndReports.
//   - "optionally restores the previous run's session":
//     TestRunTaskResumesPreviousSession, TestRunTaskSessionRoundTrip10kFiles.
//   - "If StreamSender is non-nil, stdout goes to it as deltas":
//     TestRunTaskSucceededPersistsEverythingAndReports,
//     TestRunTaskThroughFaultyControlPlane.
//   - "TracePath is the trace's key in run-global storage,
//     traces/<session>/rt_<agentRunID>.jsonl": TestRunTaskSucceededPersistsEverythingAndReports.
//   - PromptTokens/CompletionTokens are metered: TestRunTaskNeverLetsTheModelKeyIn.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// Seed: TaskRunUpdater { UpdateRunStatus(ctx, taskRunID, *PatchTaskRunRequest) error }
// is what the HTTP client and the terminal updater implement.
var (
	_ taskrun.TaskRunUpdater = (*workerclient.Client)(nil)
	_ taskrun.TaskRunUpdater = (*workerclient.TerminalUpdater)(nil)
)

// Seed: "the full output is still kept for persisting and for the PATCH" —
// also when StreamSender is nil.
func TestSeedRunTaskWithoutStreamSenderKeepsFullOutput(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "nostream1", "sh", "-c", "echo one; echo two")
	in.StreamSender = nil

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, "one\ntwo\n", out.Result.OutputStr)
	assert.Equal(t, []byte("one\ntwo\n"), out.Result.Output)
	assert.Equal(t, "one\ntwo\n", h.runFile(t, "nostream1", taskrun.OutputLogName))
	require.NotNil(t, last(t, rec).Output)
	assert.Equal(t, "one\ntwo\n", *last(t, rec).Output)
	assert.Zero(t, len(streamed(rec)), "nothing was streamed")
}

// Seed: RunTask returns an error for a failed run and nil for a successful one.
func TestSeedRunTaskReturnsErrorOnlyOnFailure(t *testing.T) {
	h := newHarness(t)
	require.NoError(t, taskrun.RunTask(context.Background(), h.input(&controlplanetest.Recorder{}, "ok1", "true")))
	require.ErrorIs(t, taskrun.RunTask(context.Background(), h.input(&controlplanetest.Recorder{}, "bad1", "false")), taskrun.ErrRunFailed)
}

// Seed: RunResult's fields and their snake_case JSON names; EndTime is set.
func TestSeedRunResultFields(t *testing.T) {
	h := newHarness(t)
	out, err := taskrun.Execute(context.Background(), h.input(&controlplanetest.Recorder{}, "fields1", "sh", "-c", "echo x > /taskrun/artifacts/a.txt; echo hi"))
	require.NoError(t, err)
	res := out.Result
	assert.Positive(t, res.EndTime)
	assert.Equal(t, "hi\n", res.OutputStr)
	assert.Equal(t, h.Root, res.RunArtifactsDir[:len(h.Root)])
	assert.True(t, strings.HasSuffix(res.RunArtifactsDir, "/runs/fields1/artifacts"))
	assert.Nil(t, res.PromptTokens, "no model, no tokens")

	data, err := json.Marshal(res)
	require.NoError(t, err)
	var fields map[string]any
	require.NoError(t, json.Unmarshal(data, &fields))
	for _, k := range []string{"end_time", "output_str", "run_artifacts_dir", "prompt_tokens", "completion_tokens", "trace_path"} {
		assert.Contains(t, fields, k)
	}
}

// Seed: NewRuntimePathsFromRoot lays out
// ROOT/users/U/conversations/C/tasks/T/runs/R/{home,artifacts,global,output}.
func TestSeedRuntimePathsLayout(t *testing.T) {
	p := taskrun.NewRuntimePathsFromRoot("/srv/runs")
	run := "/srv/runs/users/u1/conversations/c1/tasks/t1/runs/r1"
	assert.Equal(t, run, p.RuntimeTaskRunDir("u1", "c1", "t1", "r1"))
	assert.Equal(t, run+"/home", p.RuntimeTaskRunHomeDir("u1", "c1", "t1", "r1"))
	assert.Equal(t, run+"/artifacts", p.RuntimeTaskRunArtifactsDir("u1", "c1", "t1", "r1"))
	assert.Equal(t, run+"/global", p.RuntimeTaskRunGlobalDir("u1", "c1", "t1", "r1"))
	assert.Equal(t, run+"/output", p.RunOutputDir("u1", "c1", "t1", "r1"))
	assert.True(t, strings.HasPrefix(p.PersistentUserDir("u1"), "/srv/runs/users/u1/"))
	assert.Empty(t, p.RuntimeTaskRunDir("u1", "c1", "../t1", "r1"), "a bad ID never forms a path")
}

// Seed: BuildRunAgentsMdContent returns the run-directory section first, then
// runHome/AGENTS.md; WriteRunAgentsMd writes it to runDir/AGENTS.md.
func TestSeedAgentsMd(t *testing.T) {
	runDir := t.TempDir()
	home := filepath.Join(runDir, "home")
	require.NoError(t, os.Mkdir(home, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(home, "AGENTS.md"), []byte("use tabs\n"), 0o644))

	content, err := taskrun.BuildRunAgentsMdContent(home)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(content, "# Run directory"))
	assert.Greater(t, strings.Index(content, "use tabs"), strings.Index(content, "/taskrun/home"))

	require.NoError(t, taskrun.WriteRunAgentsMd(runDir, home))
	written, err := os.ReadFile(filepath.Join(runDir, "AGENTS.md"))
	require.NoError(t, err)
	assert.Equal(t, content, string(written))
}
