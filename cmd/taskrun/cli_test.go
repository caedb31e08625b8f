package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
)

// taskrunCmd runs the CLI in-process with args and returns stdout, stderr and
// the exit status. Nothing here needs a Docker engine.
func taskrunCmd(args ...string) (string, string, int) {
	var stdout, stderr lockedbuf.Buffer
	code := dispatch(context.Background(), args, &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

func TestNoArgumentsPrintsUsageToStderrAndExits2(t *testing.T) {
	stdout, stderr, code := taskrunCmd()
	assert.Equal(t, exitUsage, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "Commands:")
}

func TestHelpListsEveryCommandOnStdout(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}, {"--quiet", "help"}} {
		stdout, stderr, code := taskrunCmd(args...)
		assert.Equal(t, exitOK, code, "%q: %s", args, stderr)
		assert.Empty(t, stderr, "%q", args)
		for _, c := range commands {
			assert.Regexp(t, `(?m)^  `+c.Name+` +`+regexpQuote(c.Synopsis)+`$`, stdout, "%q lists %s", args, c.Name)
		}
		assert.Contains(t, stdout, "--log-format")
		assert.Contains(t, stdout, "--quiet")
	}
}

func regexpQuote(s string) string { return regexp.QuoteMeta(s) }

// taskrun help CMD, taskrun CMD --help and taskrun CMD -h print the same help
// on stdout and exit 0, for every command.
func TestEveryCommandHasHelpOnStdout(t *testing.T) {
	for _, c := range commands {
		t.Run(c.Name, func(t *testing.T) {
			want, stderr, code := taskrunCmd("help", c.Name)
			require.Equal(t, exitOK, code, stderr)
			assert.Empty(t, stderr)
			assert.True(t, strings.HasPrefix(want, "Usage:\n  taskrun "+c.Name), want)
			assert.Contains(t, want, "Global flags:")
			for _, flag := range []string{"--help", "-h"} {
				got, stderr, code := taskrunCmd(c.Name, flag)
				assert.Equal(t, exitOK, code, stderr)
				assert.Empty(t, stderr)
				assert.Equal(t, want, got, "taskrun %s %s", c.Name, flag)
			}
		})
	}
}

func TestUnknownCommandsAndFlagsExit2WithAHint(t *testing.T) {
	for _, tc := range []struct {
		args []string
		hint string
	}{
		{[]string{"frobnicate"}, "taskrun help"},
		{[]string{"help", "frobnicate"}, "no such command"},
		{[]string{"--no-such-flag"}, "taskrun help"},
		{[]string{"gc", "--no-such-flag"}, "taskrun help gc"},
		{[]string{"gc", "extra"}, `unexpected argument "extra"`},
		{[]string{"version", "extra"}, `unexpected argument "extra"`},
		{[]string{"images"}, "taskrun images build"},
		{[]string{"persist"}, "--run-id is required"},
		{[]string{"persist", "--run-id", "a/b"}, "use 1-128 characters"},
		{[]string{"persist", "--run-id", "r1", "--token", "t"}, "--token needs --server"},
		{[]string{"audit"}, "exactly one"},
		{[]string{"audit", "c1", "--all"}, "exactly one"},
		{[]string{"run", "--memory", "lots"}, "give a size such as 512m"},
		{[]string{"--log-format", "yaml", "version"}, "use text or json"},
		{[]string{"version", "--log-format=xml"}, "use text or json"},
	} {
		stdout, stderr, code := taskrunCmd(tc.args...)
		assert.Equal(t, exitUsage, code, "%q: %s", tc.args, stderr)
		assert.Empty(t, stdout, "%q", tc.args)
		assert.Contains(t, stderr, tc.hint, "%q", tc.args)
	}
}

func TestGlobalFlagsGoBeforeOrAfterTheCommand(t *testing.T) {
	for _, args := range [][]string{
		{"--quiet", "version"}, {"-q", "version"}, {"version", "--quiet"},
		{"--log-format", "json", "version"}, {"version", "--log-format=json"},
	} {
		stdout, stderr, code := taskrunCmd(args...)
		assert.Equal(t, exitOK, code, "%q: %s", args, stderr)
		assert.Equal(t, "taskrun "+version+"\n", stdout)
	}
}

// commandFlags returns the parsed flag set of command name for args.
func commandFlags(t *testing.T, name string, args ...string) *pflag.FlagSet {
	t.Helper()
	c := lookup(name)
	require.NotNil(t, c)
	fs := newFlagSet(name, nil)
	fs.SetInterspersed(!c.StopAtCommand)
	c.Flags(fs)
	require.NoError(t, fs.Parse(args))
	return fs
}

func TestAuditAndGCTakeFlagsAfterArguments(t *testing.T) {
	fs := commandFlags(t, "audit", "c1", "--json", "c2", "--require-gvisor", "--root", "/runs")
	assert.Equal(t, []string{"c1", "c2"}, fs.Args())
	for _, name := range []string{"json", "require-gvisor"} {
		v, err := fs.GetBool(name)
		require.NoError(t, err)
		assert.True(t, v, name)
	}
	root, err := fs.GetString("root")
	require.NoError(t, err)
	assert.Equal(t, "/runs", root)

	fs = commandFlags(t, "gc", "--grace", "5m", "--dry-run")
	dry, err := fs.GetBool("dry-run")
	require.NoError(t, err)
	assert.True(t, dry)
	grace, err := fs.GetDuration("grace")
	require.NoError(t, err)
	assert.Equal(t, 5*time.Minute, grace)
}

// Everything after the image command belongs to it, flags included, with or
// without "--".
func TestRunStopsParsingAtTheCommand(t *testing.T) {
	o, err := parseRunFlags([]string{"--image", "img", "sh", "-c", "echo hi", "--json", "--help"})
	require.NoError(t, err)
	assert.Equal(t, "img", o.image)
	assert.False(t, o.jsonOut, "--json after the command is the command's")
	assert.Equal(t, []string{"sh", "-c", "echo hi", "--json", "--help"}, o.command)

	o, err = parseRunFlags([]string{"--json", "--", "--weird-name", "x"})
	require.NoError(t, err)
	assert.True(t, o.jsonOut)
	assert.Equal(t, []string{"--weird-name", "x"}, o.command)
}

func TestRunConversationFlag(t *testing.T) {
	o, err := parseRunFlags(nil)
	require.NoError(t, err)
	assert.Equal(t, "cli", o.conversation)
	o, err = parseRunFlags([]string{"--conversation", "c42"})
	require.NoError(t, err)
	assert.Equal(t, "c42", o.conversation)
	assert.Equal(t, "c42", o.ref().ConversationID)
}

// A flag that means the same thing in several commands has one name and one
// description everywhere, and no help text uses backticks (which pflag would
// turn into a placeholder name).
func TestFlagsAreConsistentAcrossCommands(t *testing.T) {
	shared := map[string]string{}
	for _, c := range commands {
		fs := newFlagSet(c.Name, nil)
		c.Flags(fs)
		fs.VisitAll(func(f *pflag.Flag) {
			assert.NotContains(t, f.Usage, "`", "taskrun %s --%s", c.Name, f.Name)
			assert.NotEqual(t, "runs-root", f.Name, "the run directories' root is --root everywhere")
			switch f.Name {
			case "root", "server", "token", "user", "conversation", "task", "session":
				if prev, ok := shared[f.Name]; ok {
					assert.Equal(t, prev, f.Usage, "taskrun %s --%s", c.Name, f.Name)
				}
				shared[f.Name] = f.Usage
			}
		})
		help, _, code := taskrunCmd("help", c.Name)
		require.Equal(t, exitOK, code)
		assert.NotContains(t, help, "`", "taskrun help %s", c.Name)
	}
	usage, _, _ := taskrunCmd("help")
	assert.NotContains(t, usage, "`")
}

// The summary repeats the process's exit status: 124 for a timeout, not the
// 143 of the SIGTERM that stopped the container.
func TestSummaryExitStatusIsTheProcesss(t *testing.T) {
	start := time.Now()
	for _, tc := range []struct {
		out  *taskrun.Outcome
		err  error
		want int
	}{
		{&taskrun.Outcome{Status: model.StatusFailed, ContainerID: "c", Exit: sandbox.Result{ExitCode: 143, TimedOut: true}}, taskrun.ErrRunFailed, exitTimeout},
		{&taskrun.Outcome{Status: model.StatusCancelled, ContainerID: "c", Exit: sandbox.Result{ExitCode: 143}}, taskrun.ErrRunFailed, exitInterrupted},
		{&taskrun.Outcome{Status: model.StatusFailed, ContainerID: "c", Exit: sandbox.Result{ExitCode: 7}}, taskrun.ErrRunFailed, 7},
		{&taskrun.Outcome{Status: model.StatusSucceeded, ContainerID: "c", Exit: sandbox.Result{StartedAt: start, FinishedAt: start.Add(time.Second)}}, nil, 0},
	} {
		code := exitCode(tc.out, tc.err)
		require.Equal(t, tc.want, code)
		var w strings.Builder
		writeSummary(&w, runRefFlags{user: "u", runID: "r1"}, "mem://", tc.out, code)
		assert.Regexp(t, `run r1: `+string(tc.out.Status)+` \(exit `+strconv.Itoa(tc.want)+`[,)]`, w.String())
	}
}

// Names in the summary come from the agent (artifact paths, the reason): they
// reach the terminal escaped.
func TestSummaryEscapesNames(t *testing.T) {
	out := &taskrun.Outcome{
		Status: model.StatusFailed, Reason: "agent said \x1b]0;owned\x07",
		Stored: []persist.ObjectInfo{{Key: "tenants/u/conversations/cli/tasks/t/runs/r1/artifacts/\x1b[2Jx\u009b.txt", Size: 1}},
	}
	var w strings.Builder
	writeSummary(&w, runRefFlags{user: "u", runID: "r1"}, "mem://", out, exitFailure)
	assert.NotContains(t, w.String(), "\x1b")
	assert.NotContains(t, w.String(), "\u009b")
	assert.Contains(t, w.String(), "agent said ^[]0;owned^G")
	assert.Contains(t, w.String(), `artifacts/^[[2Jx\u009b.txt`)
}

// The trace line and --json name the trace's real key in the store.
func TestTraceKeyIsTheStoredKey(t *testing.T) {
	ref := persist.RunRef{UserID: "u1", ConversationID: "cli", TaskID: "t", RunID: "r1"}
	logKey, err := persist.RunKey(ref, taskrun.OutputLogName)
	require.NoError(t, err)
	trace, err := persist.GlobalKey("u1", "traces/s/rt_r1.jsonl")
	require.NoError(t, err)
	out := &taskrun.Outcome{
		Status: model.StatusSucceeded,
		Result: taskrun.RunResult{TracePath: "traces/s/rt_r1.jsonl"},
		Stored: []persist.ObjectInfo{{Key: logKey}, {Key: trace}},
	}
	assert.Equal(t, trace, traceKey(out, "u1"))
	var w strings.Builder
	writeSummary(&w, runRefFlags{user: "u1", runID: "r1"}, "mem://", out, 0)
	assert.Contains(t, w.String(), "  trace:     "+trace+"\n")

	out.Stored = out.Stored[:1]
	assert.Empty(t, traceKey(out, "u1"), "no trace line for a trace that was not stored")
}

// --json lists every stored object, and names the artifacts directory only
// while it exists.
func TestJSONResultListsStoredKeysAndNoGoneDirectory(t *testing.T) {
	stored := []persist.ObjectInfo{{Key: "tenants/u/global/traces/s/rt_r1.jsonl", Size: 3, SHA256: "abc"}, {Key: "tenants/u/x/output.log", Size: 1}}
	decode := func(dir string) map[string]any {
		var w strings.Builder
		writeJSONResult(&w, runRefFlags{user: "u", runID: "r1"}, &taskrun.Outcome{
			Status: model.StatusSucceeded, Stored: stored,
			Result: taskrun.RunResult{RunArtifactsDir: dir, TracePath: "traces/s/rt_r1.jsonl"},
		}, nil)
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(w.String()), &m), w.String())
		return m
	}
	m := decode(t.TempDir() + "/removed")
	assert.NotContains(t, m["result"], "run_artifacts_dir")
	assert.Equal(t, "tenants/u/global/traces/s/rt_r1.jsonl", m["trace_key"])
	require.Len(t, m["stored"], 2)
	assert.Equal(t, "tenants/u/x/output.log", m["stored"].([]any)[1].(map[string]any)["key"])

	kept := t.TempDir()
	m = decode(kept)
	assert.Equal(t, kept, m["result"].(map[string]any)["run_artifacts_dir"])

	var w strings.Builder
	writeJSONResult(&w, runRefFlags{runID: "r2"}, nil, errCannotRun)
	assert.Contains(t, w.String(), `"stored": []`, "stored is a list even when nothing ran")
}
