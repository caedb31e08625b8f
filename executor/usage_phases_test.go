package executor_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// The container's usage, as the backend sampled it, is in the run's
// outcome, its index record and its attestation.
func TestPhasesUsageIsInTheRunsRecords(t *testing.T) {
	u := newUnit(t)
	s, v := newSigner(t)
	stats := sandbox.Stats{CPU: 2500 * time.Millisecond, MemoryBytes: 60 << 20, PeakMemoryBytes: 65 << 20, ReadBytes: 1 << 20, WriteBytes: 21 << 20, Pids: 11}
	in := u.input("use1", func(ctx context.Context, p *sandboxfake.Process) int {
		p.SetStats(stats)
		// Held until the runner sampled the figures above.
		from := p.StatsReads()
		for p.StatsReads() == from {
			select {
			case <-ctx.Done():
				return 1
			case <-time.After(5 * time.Millisecond):
			}
		}
		return 0
	})
	in.AttestKey = s
	out, err := executor.Execute(context.Background(), in)
	require.NoError(t, err)
	require.Equal(t, model.StatusSucceeded, out.Status)

	want := sandbox.Usage{CPUSeconds: 2.5, PeakMemoryBytes: 65 << 20, ReadBytes: 1 << 20, WriteBytes: 21 << 20, PeakPids: 11}
	got := func(u *sandbox.Usage) sandbox.Usage {
		t.Helper()
		require.NotNil(t, u)
		assert.Positive(t, u.Samples)
		c := *u
		c.Samples = 0
		return c
	}
	assert.Equal(t, want, got(out.Usage), "the outcome")

	rec, err := runindex.Find(context.Background(), u.store, "use1", "user1")
	require.NoError(t, err)
	assert.Equal(t, want, got(rec.Usage), "the index record")

	res := u.verifyStored(t, "use1", v)
	require.NoError(t, res.Err())
	require.NotNil(t, res.Predicate)
	var pred sandbox.Usage
	require.NoError(t, json.Unmarshal(res.Predicate.Usage, &pred))
	assert.Equal(t, want, got(&pred), "the attestation")
}

// A run whose container never started has no usage.
func TestPhasesNoUsageWithoutAContainer(t *testing.T) {
	u := newUnit(t)
	u.b.FailStarts(assert.AnError)
	out, err := executor.Execute(context.Background(), u.input("use2", func(context.Context, *sandboxfake.Process) int { return 0 }))
	require.Error(t, err)
	require.NotNil(t, out)
	assert.Nil(t, out.Usage)
	assert.Zero(t, u.b.StatsReads())
}
