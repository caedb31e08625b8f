package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/timings"
)

// A real run with every protection on (self-check, live audit, disk cap,
// own uid, gc at start) records every phase in `taskrun run --json` and in
// its stored record, and `taskrun inspect` shows them.
func TestRunRecordsEveryPhase(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real containers")
	}
	store := "file://" + t.TempDir()
	stdout, stderr, code := taskrunCmd("run", "--root", t.TempDir(), "--store", store, "--user", tenant(t),
		"--helpers-dir", testbin.Dir(t), "--image", testImage, "--json", "--", "echo", "hi")
	require.Equal(t, exitOK, code, stderr)
	var res struct {
		RunID   string         `json:"run_id"`
		Timings []timings.Span `json:"timings"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	every := []string{
		timings.Setup, timings.GC, timings.Plan, timings.Preflight, timings.Admit, timings.Journal,
		timings.Prepare, timings.UIDLease, timings.DiskCap, timings.Materialize, timings.Snapshot,
		timings.Gateway, timings.Launch, timings.Create, timings.Attach, timings.Start,
		timings.SelfCheck, timings.LiveAudit, timings.FirstByte, timings.Wait, timings.Records, timings.Drain,
		timings.Remove, timings.Collect, timings.KeepLocal, timings.Persist, timings.Release,
		timings.Report, timings.Index,
	}
	for _, phase := range every {
		_, ok := timings.Find(res.Timings, phase)
		assert.True(t, ok, "--json times %s: %v", phase, res.Timings)
	}

	out, stderr, code := taskrunCmd("inspect", "--store", store, "--json", res.RunID)
	require.Equal(t, exitOK, code, stderr)
	var rec runindex.Record
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	for _, phase := range every[:len(every)-2] { // the index write and the final report come after its record
		_, ok := timings.Find(rec.Timings, phase)
		assert.True(t, ok, "the stored record times %s: %v", phase, rec.Timings)
	}

	text, stderr, code := taskrunCmd("inspect", "--store", store, res.RunID)
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, text, "Timings:")
	assert.Regexp(t, `(?m)^  live_audit +[0-9.]+ +[0-9.]+$`, text)
}
