package taskrun_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// Every run's isolation record holds the host-side posture, passing audit
// verdicts and the in-sandbox self-check's report.
func TestRunTaskStoresIsolationRecordWithProbeReport(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "iso1", "sh", "-c", "echo agent ran")
	in.HelpersDir = testbin.Dir(t)

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, "agent ran\n", out.Result.OutputStr, "the probe's report line never reaches the run's output")

	var record audit.Record
	require.NoError(t, json.Unmarshal([]byte(h.runFile(t, "iso1", taskrun.AuditRecordName)), &record))
	assert.Equal(t, out.ContainerID, record.ContainerID)
	require.NotNil(t, record.Probe, "the self-check reported from inside")
	assert.Empty(t, record.ProbeContradictions)
	for _, f := range record.Findings {
		assert.NotEqual(t, audit.Fail, f.Status, "rule %s: %s", f.ID, f.Reason)
	}
	assert.False(t, record.Recheck().Failed())
	final := last(t, rec)
	require.NotNil(t, final.Container)
	assert.Equal(t, record.ImageDigest, final.Container.ImageDigest)
}

// loosenedBackend hands the engine a looser policy than the run asked for,
// as a buggy or tampered backend would.
type loosenedBackend struct {
	*docker.Backend
	loosen func(*sandbox.Policy)
}

func (b loosenedBackend) Start(ctx context.Context, spec sandbox.Spec, p sandbox.Policy, s sandbox.Streams) (sandbox.Handle, error) {
	b.loosen(&p)
	return b.Backend.Start(ctx, spec, p, s)
}

func (b loosenedBackend) Create(ctx context.Context, spec sandbox.Spec, p sandbox.Policy) (sandbox.Created, error) {
	b.loosen(&p)
	return b.Backend.Create(ctx, spec, p)
}

// A contradiction between policy and sandbox refuses the run before the agent
// starts: the self-check sees pids.max 512 where the policy says 256.
func TestRunTaskProbeContradictionRefusesRun(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "refused1", "sh", "-c", "touch /taskrun/output/agent-ran")
	in.HelpersDir = testbin.Dir(t)
	in.Sandbox = loosenedBackend{Backend: h.Backend, loosen: func(p *sandbox.Policy) { p.PidsLimit = 512 }}

	out, err := taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, taskrun.ErrIsolation)
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.Equal(t, executor.ProbeRefusedExitCode, out.Exit.ExitCode)
	assert.Contains(t, out.Reason, "self-check refused")
	_, err = h.Store.OpenRunFile(context.Background(), h.Ref("refused1"), "output/agent-ran")
	assert.ErrorIs(t, err, persist.ErrNotFound, "the agent must never start")

	var record audit.Record
	require.NoError(t, json.Unmarshal([]byte(h.runFile(t, "refused1", taskrun.AuditRecordName)), &record))
	assert.NotEmpty(t, record.ProbeContradictions)
	assert.True(t, record.Recheck().Failed())
}

// The host-side audit of the live container refuses a run whose container
// has a network although the policy says none.
func TestRunTaskHostAuditRefusesNetworkedContainer(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "refused2", "sh", "-c", "sleep 30")
	in.Sandbox = loosenedBackend{Backend: h.Backend, loosen: func(p *sandbox.Policy) { p.NetworkMode = "bridge" }}

	out, err := taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, taskrun.ErrIsolation)
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.Contains(t, out.Reason, "5.10")
}

// Under gVisor the run is really in runsc (its kernel says so), the
// self-check passes with the checks gVisor can show, and the record says runsc.
func TestRunTaskUnderGVisor(t *testing.T) {
	h := newHarness(t)
	requireRunsc(t, h)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "gvisor1", "sh", "-c", "dmesg | head -1")
	in.HelpersDir = testbin.Dir(t)
	in.Policy = sandbox.DefaultPolicy()
	in.Policy.Runtime = sandbox.RuntimeGVisor

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Contains(t, out.Result.OutputStr, "gVisor")
	var record audit.Record
	require.NoError(t, json.Unmarshal([]byte(h.runFile(t, "gvisor1", taskrun.AuditRecordName)), &record))
	assert.Equal(t, sandbox.RuntimeGVisor, record.Runtime)
	assert.False(t, record.Recheck().Failed(), "failed: %v", record.Recheck().FailedIDs())
}

// requireRunsc skips without gVisor, unless TASKRUN_REQUIRE_RUNSC=1 (CI).
func requireRunsc(t *testing.T, h *harness) {
	t.Helper()
	host, err := h.Backend.HostFacts(context.Background())
	require.NoError(t, err)
	if !slices.Contains(host.Runtimes, sandbox.RuntimeGVisor) {
		if os.Getenv("TASKRUN_REQUIRE_RUNSC") == "1" {
			t.Fatal("runsc is not registered with dockerd; .ci/run registers it")
		}
		t.Skip("runsc is not registered with dockerd")
	}
}

// A helpers directory without the self-check refuses the run up front: the
// self-check is never skipped silently.
func TestRunTaskRefusesMissingSelfCheck(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "noprobe1", "true")
	in.HelpersDir = t.TempDir()

	out, err := taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, taskrun.ErrIsolation)
	assert.Empty(t, out.ContainerID)
	assert.Equal(t, model.StatusFailed, last(t, rec).Status)
	entries, err := os.ReadDir(h.Root)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written on disk")
}

// slowAuditBackend runs containers confined as asked, but its engine answers
// the live audit's inspect slowly, with the posture tamper makes of it, as a
// loaded or compromised engine would.
type slowAuditBackend struct {
	*docker.Backend
	delay  time.Duration
	tamper func(*sandbox.Posture)
}

func (b slowAuditBackend) Start(ctx context.Context, spec sandbox.Spec, p sandbox.Policy, s sandbox.Streams) (sandbox.Handle, error) {
	h, err := b.Backend.Start(ctx, spec, p, s)
	if err != nil {
		return nil, err
	}
	return slowAuditHandle{Handle: h, b: b}, nil
}

func (b slowAuditBackend) Create(ctx context.Context, spec sandbox.Spec, p sandbox.Policy) (sandbox.Created, error) {
	c, err := b.Backend.Create(ctx, spec, p)
	if err != nil {
		return nil, err
	}
	return slowAuditCreated{Created: c, b: b}, nil
}

type slowAuditCreated struct {
	sandbox.Created
	b slowAuditBackend
}

func (c slowAuditCreated) Start(ctx context.Context, s sandbox.Streams) (sandbox.Handle, error) {
	h, err := c.Created.Start(ctx, s)
	if err != nil {
		return nil, err
	}
	return slowAuditHandle{Handle: h, b: c.b}, nil
}

type slowAuditHandle struct {
	sandbox.Handle
	b slowAuditBackend
}

func (h slowAuditHandle) Posture(ctx context.Context) (sandbox.Posture, error) {
	select {
	case <-time.After(h.b.delay):
	case <-ctx.Done():
		return sandbox.Posture{}, ctx.Err()
	}
	p, err := h.Handle.Posture(ctx)
	if err == nil && h.b.tamper != nil {
		h.b.tamper(&p)
	}
	return p, err
}

// The self-check holds the agent until the host's live audit passed: when
// the audit fails, however late, the agent never ran a single instruction.
// (Without the hold the agent would run during the slow audit and leave its
// mark.) A slow audit that passes only delays the agent.
func TestRunTaskAgentWaitsForTheLiveAudit(t *testing.T) {
	h := newHarness(t)
	t.Run("refused", func(t *testing.T) {
		rec := &controlplanetest.Recorder{}
		in := h.input(rec, "held1", "sh", "-c", "echo escaped; touch /taskrun/output/agent-ran")
		in.HelpersDir = testbin.Dir(t)
		in.Sandbox = slowAuditBackend{Backend: h.Backend, delay: 2 * time.Second, tamper: func(p *sandbox.Posture) { p.NetworkMode = "bridge" }}

		out, err := taskrun.Execute(context.Background(), in)
		require.ErrorIs(t, err, taskrun.ErrIsolation)
		assert.Contains(t, out.Reason, "5.10")
		assert.NotContains(t, out.Result.OutputStr, "escaped", "the agent must never start")
		_, err = h.Store.OpenRunFile(context.Background(), h.Ref("held1"), "output/agent-ran")
		assert.ErrorIs(t, err, persist.ErrNotFound, "the agent must never start")
		for _, u := range rec.Patches() {
			assert.NotEqual(t, model.StatusRunning, u.Status, "no RUNNING for an agent that was never let go")
		}
	})
	t.Run("passes", func(t *testing.T) {
		rec := &controlplanetest.Recorder{}
		in := h.input(rec, "held2", "sh", "-c", "echo agent ran")
		in.HelpersDir = testbin.Dir(t)
		in.Sandbox = slowAuditBackend{Backend: h.Backend, delay: time.Second}

		out, err := taskrun.Execute(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, "agent ran\n", out.Result.OutputStr)
		live, ok := timings.Find(out.Timings, timings.LiveAudit)
		require.True(t, ok)
		first, ok := timings.Find(out.Timings, timings.FirstByte)
		require.True(t, ok)
		assert.GreaterOrEqual(t, first.StartMS+first.DurationMS, live.StartMS+live.DurationMS, "the agent's first byte came after the audit passed")
	})
}
