package worker_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// Each run's sampled usage is one observation of the worker's usage
// histograms and adds to its counters, with no per-run label.
func TestWorkerExportsRunUsage(t *testing.T) {
	f := newFixture(t)
	f.b.Install("/agent/busy", func(ctx context.Context, p *sandboxfake.Process) int {
		p.SetStats(sandbox.Stats{CPU: 2 * time.Second, MemoryBytes: 64 << 20, PeakMemoryBytes: 100 << 20, ReadBytes: 1000, WriteBytes: 20 << 20, Pids: 10})
		from := p.StatsReads()
		for p.StatsReads() == from { // held until sampled
			select {
			case <-ctx.Done():
				return 1
			case <-time.After(5 * time.Millisecond):
			}
		}
		return 0
	})
	f.cp.Enqueue(assignment("u1", "busy"))
	f.cp.Enqueue(assignment("u2", "busy"))
	w, stop := f.start(t)
	for _, id := range []string{"u1", "u2"} {
		info := f.final(t, id)
		require.Equal(t, model.StatusSucceeded, info.Status, info.Reason)
	}
	require.NoError(t, stop())

	srv := httptest.NewServer(w.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var usage []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "taskrun_worker_run_") && !strings.HasPrefix(line, "taskrun_worker_run_duration") {
			usage = append(usage, line)
		}
	}
	for _, want := range []string{
		"taskrun_worker_run_cpu_seconds_count 2",
		"taskrun_worker_run_cpu_seconds_sum 4",
		`taskrun_worker_run_cpu_seconds_bucket{le="1"} 0`,
		`taskrun_worker_run_cpu_seconds_bucket{le="5"} 2`,
		"taskrun_worker_run_peak_memory_bytes_count 2",
		"taskrun_worker_run_peak_memory_bytes_sum 2.097152e+08",
		"taskrun_worker_run_peak_pids_sum 20",
		`taskrun_worker_run_block_io_bytes_total{op="write"} 4.194304e+07`,
		`taskrun_worker_run_block_io_bytes_total{op="read"} 2000`,
	} {
		assert.Contains(t, usage, want)
	}
	for _, line := range usage {
		assert.NotContains(t, line, "u1", "no per-run label")
	}
	assert.InDelta(t, 4, testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_run_cpu_seconds_total", "")), 1e-9)
}
