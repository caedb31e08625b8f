package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runDir lays out a run directory like the executor does and returns its root.
func runDir(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"home", "artifacts", "global", "output"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, "AGENTS.md"), []byte("# Run\nBe careful.\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "prompt.txt"), []byte("Summarise the workspace."), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "home", "README.md"), []byte("hello\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "home", "src"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "home", "src", "main.go"), []byte("package main\n"), 0o644))
	return root
}

// envFor returns a getenv serving the given variables.
func envFor(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// readTrace parses a JSONL trace file into events.
func readTrace(t *testing.T, path string) []traceEvent {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var events []traceEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev traceEvent
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev), "trace line %q", sc.Text())
		require.False(t, ev.Time.IsZero(), "every event has a timestamp")
		events = append(events, ev)
	}
	require.NoError(t, sc.Err())
	return events
}

func eventNames(events []traceEvent) []string {
	names := make([]string, len(events))
	for i, ev := range events {
		names[i] = ev.Event
	}
	return names
}

func TestOfflineRoutineWritesOutputsTraceAndSession(t *testing.T) {
	root := runDir(t)
	env := envFor(map[string]string{"TASKRUN_RUN_ID": "run1", "TASKRUN_TASK_ID": "task1", "TASKRUN_SESSION_ID": "sess1"})
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"-root", root, "-step", "0"}, env, &out))

	lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
	assert.GreaterOrEqual(t, len(lines), 5, "progress lines: %s", out.String())
	assert.Contains(t, out.String(), "starting session sess1")

	report, err := os.ReadFile(filepath.Join(root, "artifacts", "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(report), "- README.md")
	assert.Contains(t, string(report), "- src/main.go")
	assert.Contains(t, string(report), "> Summarise the workspace.")
	assert.NotContains(t, string(report), ".taskrun-agent", "the agent's own state is not listed")

	result, err := os.ReadFile(filepath.Join(root, "output", "result.md"))
	require.NoError(t, err)
	assert.Contains(t, string(result), "Offline run 1 of session sess1")

	events := readTrace(t, filepath.Join(root, "global", "traces", "sess1", "rt_run1.jsonl"))
	names := eventNames(events)
	require.NotEmpty(t, names)
	assert.Equal(t, "run_start", names[0])
	assert.Equal(t, "run_end", names[len(names)-1])
	assert.Equal(t, true, events[len(events)-1].Data["ok"])
	assert.Contains(t, names, "workspace_listed")
	assert.Contains(t, names, "artifact_written")

	s, err := loadSession(filepath.Join(root, "home", ".taskrun-agent"))
	require.NoError(t, err)
	assert.Equal(t, 1, s.RunCount)
	assert.Equal(t, "sess1", s.SessionID)
}

func TestOfflineResumedSessionShowsContinuity(t *testing.T) {
	root := runDir(t)
	for _, runID := range []string{"run1", "run2"} {
		env := envFor(map[string]string{"TASKRUN_RUN_ID": runID, "TASKRUN_SESSION_ID": "sess1"})
		var out bytes.Buffer
		require.NoError(t, run(context.Background(), []string{"-root", root, "-step", "0"}, env, &out))
		if runID == "run2" {
			assert.Contains(t, out.String(), "resuming session sess1: 1 earlier run(s), last run1")
		}
	}
	s, err := loadSession(filepath.Join(root, "home", ".taskrun-agent"))
	require.NoError(t, err)
	assert.Equal(t, 2, s.RunCount)
	require.Len(t, s.Runs, 2)
	assert.Equal(t, "run1", s.Runs[0].RunID)
	assert.Equal(t, "run2", s.Runs[1].RunID)
	result, err := os.ReadFile(filepath.Join(root, "output", "result.md"))
	require.NoError(t, err)
	assert.Contains(t, string(result), "Offline run 2 of session sess1")
	assert.FileExists(t, filepath.Join(root, "global", "traces", "sess1", "rt_run2.jsonl"))
}

func TestConfigRejectsPathFormingIDs(t *testing.T) {
	for _, id := range []string{"", "../x", "a/b", "run.1"} {
		_, err := parseConfig([]string{"-root", t.TempDir()}, envFor(map[string]string{"TASKRUN_RUN_ID": id}))
		require.ErrorIs(t, err, errBadConfig, "run ID %q", id)
	}
	_, err := parseConfig(nil, envFor(map[string]string{"TASKRUN_RUN_ID": "ok", "TASKRUN_SESSION_ID": "../../etc"}))
	require.ErrorIs(t, err, errBadConfig)
}
