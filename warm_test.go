package taskrun_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// paths are the two ways a run gets its container: created for it (cold),
// or parked ahead of it by a warm pool.
var paths = []struct {
	name string
	warm bool
}{{"cold", false}, {"warm", true}}

// warmRecord runs agentScript on one path and returns its outcome, the
// stream its control plane received and its isolation record.
func runOnPath(t *testing.T, warm bool) (*taskrun.Outcome, *controlplanetest.Recorder, audit.Record, *harness) {
	t.Helper()
	h := &harness{runtest.New(t, runtest.Options{Warm: warm})}
	rec := &controlplanetest.Recorder{}
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "AGENTS.md"), []byte("workspace rules"), 0o644))
	in := h.input(rec, "run1", "sh", "-c", agentScript+"\necho; id -u; ls -a /taskrun")
	in.Task.WorkspaceDir = ws
	in.HelpersDir = testbin.Dir(t)
	out, err := h.Execute(context.Background(), in)
	require.NoError(t, err)
	var record audit.Record
	require.NoError(t, json.Unmarshal([]byte(h.runFile(t, "run1", taskrun.AuditRecordName)), &record))
	return out, rec, record, h
}

// A warm run does what a cold run does, byte for byte on stdout and the
// stream, and is confined, checked and recorded the same: the same audit
// rules with the same verdicts, the self-check's report without
// contradiction, and the same posture but for the names of the container
// and its run directory.
func TestWarmRunIsTheColdRun(t *testing.T) {
	t.Parallel()
	type result struct {
		out    *taskrun.Outcome
		stream string
		record audit.Record
	}
	got := map[string]result{}
	for _, path := range paths {
		out, rec, record, _ := runOnPath(t, path.warm)
		assert.Equal(t, model.StatusSucceeded, out.Status, path.name)
		got[path.name] = result{out, streamed(rec), record}
	}
	cold, warm := got["cold"], got["warm"]
	assert.Equal(t, cold.out.Result.OutputStr, warm.out.Result.OutputStr, "stdout")
	assert.Equal(t, cold.stream, warm.stream, "every streamed byte")
	assert.NotContains(t, warm.out.Result.OutputStr, ".gate", "nothing of the gate is left in the run dir")

	// Both paths are timed phase by phase; only the warm one claimed a
	// container, and it still ran the live audit and removed its container
	// in the background.
	phases := func(out *taskrun.Outcome) []string {
		var names []string
		for _, s := range out.Timings {
			names = append(names, s.Phase)
		}
		return names
	}
	for _, phase := range []string{timings.Launch, timings.LiveAudit, timings.Wait, timings.Remove, timings.Collect, timings.Release} {
		assert.Contains(t, phases(warm.out), phase, "warm run")
		assert.Contains(t, phases(cold.out), phase, "cold run")
	}
	assert.Contains(t, phases(warm.out), timings.WarmClaim)
	assert.NotContains(t, phases(warm.out), timings.Create, "a warm run creates no container")
	assert.Contains(t, phases(cold.out), timings.Create)

	require.NotNil(t, warm.record.Probe, "the self-check reported for the warm run")
	assert.Empty(t, warm.record.ProbeContradictions)
	findings := func(r audit.Record) map[string]audit.Status {
		m := map[string]audit.Status{}
		for _, f := range r.Findings {
			m[f.ID] = f.Status
		}
		return m
	}
	assert.Equal(t, findings(cold.record), findings(warm.record), "the same rules, the same verdicts")
	for _, f := range warm.record.Findings {
		assert.NotEqual(t, audit.Fail, f.Status, "rule %s: %s", f.ID, f.Reason)
	}
	// The posture differs only in what names the container and its run.
	norm := func(p audit.Posture) audit.Posture {
		p.ID, p.Name, p.Labels = "", "", nil
		p.Mounts = slices.Clone(p.Mounts)
		for i := range p.Mounts {
			if p.Mounts[i].Destination == model.ContainerRunDir {
				p.Mounts[i].Source = ""
			}
		}
		// The engine lists mounts in no fixed order.
		slices.SortFunc(p.Mounts, func(a, b sandbox.PostureMount) int { return strings.Compare(a.Destination, b.Destination) })
		return p
	}
	assert.Equal(t, norm(cold.record.Posture), norm(warm.record.Posture))
	assert.Equal(t, warm.record.Posture.Labels[sandbox.LabelRunDir], warm.record.Options.Mounts.RunDir,
		"the audit pinned the warm run's mount to its slot directory")
}

// Runs that differ only in what a run brings (IDs, workspace, prompt,
// environment, command) share one pool key; what shapes the container
// does not.
func TestWarmTemplateKeysOnlyTheContainersShape(t *testing.T) {
	h := &harness{runtest.New(t, runtest.Options{})}
	a := h.input(&controlplanetest.Recorder{}, "run-a", "echo", "a")
	a.HelpersDir = testbin.Dir(t)
	b := h.input(&controlplanetest.Recorder{}, "run-b", "sh", "-c", "echo b")
	b.HelpersDir = a.HelpersDir
	b.Task.Prompt, b.Env = "another prompt", []string{"X=1"}
	ka, err := taskrun.WarmTemplate(t.Context(), a)
	require.NoError(t, err)
	kb, err := taskrun.WarmTemplate(t.Context(), b)
	require.NoError(t, err)
	assert.Equal(t, ka.Key(), kb.Key())
	assert.Empty(t, ka.Audit.Mounts.RunDir, "the run dir is each slot's own")

	b.Policy = sandbox.DefaultPolicy()
	b.Policy.PidsLimit = 128
	kc, err := taskrun.WarmTemplate(t.Context(), b)
	require.NoError(t, err)
	assert.NotEqual(t, ka.Key(), kc.Key(), "another policy is another container")
}

// A warm run's traced order: the slot's hook takes the place of the uid,
// run dir and dirs hooks and of the create, and is stopped (the slot's
// container closed, the files released, the uid given back) where a cold
// run releases its run dir and uid. The RUNNING report and the disk cap's
// journal entry, which depend on timing and on the host's loop devices,
// are left out.
func TestTracedOrderOfAWarmRun(t *testing.T) {
	t.Parallel()
	h := &harness{runtest.New(t, runtest.Options{Warm: true})}
	steps := &runtest.StepLog{}
	in := h.input(&controlplanetest.Recorder{}, "warmtrace1", "sh", "-c", "echo hi")
	in.HelpersDir = testbin.Dir(t)
	in.Logger = slog.New(steps)
	_, err := h.Execute(context.Background(), in)
	require.NoError(t, err)
	got := slices.DeleteFunc(steps.Take(), func(s string) bool { return s == "running" || s == "prepared" })
	assert.Equal(t, []string{
		"prestart:warm", "prestart:isolation", "prestart:workspace", "prestart:changes", "prestart:output", "prestart:gateway",
		"poststart:isolation", "started", "poststart:output", "poststart:diskwatch", "poststart:metrics",
		"exited:isolation", "exited:output", "exited:gateway", "exited:diskwatch", "exited:metrics", "remove", "judged",
		"keep", "collect:files", "seal:files", "removed", "collected",
		"stop:gateway", "stop:output", "stop:warm", "reported", "ended",
	}, got)
}
