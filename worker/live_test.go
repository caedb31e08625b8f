package worker_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/worker"
	"github.com/taskrun/taskrun/workerclient"
)

// call is one request to h with the bearer secret (none when empty): its
// status and body.
func call(t *testing.T, h http.Handler, method, path, secret string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

// A keep-alive run is served by the worker's live API, to the holder of
// its secret only, with its usage on /metrics under its run label while
// it lives; at its idle timeout it is stopped, CANCELLED, and its series
// are gone.
func TestWorkerServesALiveRunUntilItsIdleTimeout(t *testing.T) {
	f := newFixture(t)
	f.b.Install("/agent/live", func(ctx context.Context, p *sandboxfake.Process) int {
		p.SetStats(sandbox.Stats{CPU: 3 * time.Second, MemoryBytes: 32 << 20, PeakMemoryBytes: 100 << 20, Pids: 4})
		<-ctx.Done()
		return sandboxfake.KilledExitCode
	})
	f.buildHost(t)
	live, err := daemon.New(daemon.Config{Host: f.cfg.Host, MaxIdle: time.Minute})
	require.NoError(t, err)
	f.cfg.Live, f.cfg.LiveEndpoint = live, &workerclient.LiveEndpoint{URL: "http://unused", Secret: "s3cret"}
	h := live.LiveHandler("s3cret")

	a := assignment("live1", "live")
	a.KeepAlive, a.IdleTimeoutMillis, a.Ports = true, 1500, []int{8080}
	f.cp.Enqueue(a)
	w, stop := f.start(t)
	metrics := httptest.NewServer(w.Handler())
	defer metrics.Close()
	scrape := func() string {
		resp, err := http.Get(metrics.URL + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	require.Eventually(t, func() bool {
		code, _ := call(t, h, "GET", "/v1/runs/live1/ports", "s3cret")
		return code == http.StatusOK
	}, 30*time.Second, 10*time.Millisecond, "the live run was never served")
	code, body := call(t, h, "GET", "/v1/runs/live1/ports", "s3cret")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"port":8080`)
	for _, secret := range []string{"", "wrong"} {
		code, _ = call(t, h, "GET", "/v1/runs/live1/ports", secret)
		assert.Equal(t, http.StatusUnauthorized, code, "secret %q", secret)
	}
	code, _ = call(t, h, "GET", "/v1/runs/nope/ports", "s3cret")
	assert.Equal(t, http.StatusNotFound, code)

	require.Eventually(t, func() bool {
		return strings.Contains(scrape(), `taskrun_worker_live_run_peak_memory_bytes{run="live1"} 1.048576e+08`)
	}, 30*time.Second, 20*time.Millisecond, "the live run's usage is not on /metrics")
	assert.Contains(t, scrape(), `taskrun_worker_live_run_cpu_seconds{run="live1"} 3`)
	code, body = call(t, h, "GET", "/v1/runs/live1/usage", "s3cret")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"cpu_seconds":3`)

	info := f.final(t, "live1")
	assert.Equal(t, model.StatusCancelled, info.Status, info.Reason)
	assert.Contains(t, info.Reason, worker.ErrIdle.Error())
	// The run is reported before the worker lets it go.
	require.Eventually(t, func() bool { return len(w.Live()) == 0 }, 30*time.Second, 10*time.Millisecond)
	code, _ = call(t, h, "GET", "/v1/runs/live1/ports", "s3cret")
	assert.Equal(t, http.StatusNotFound, code, "an ended run is not served")
	assert.NotContains(t, scrape(), `run="live1"`)
	require.NoError(t, stop())
	assert.Empty(t, f.b.Containers(nil))
}

// A worker with no live API refuses a keep-alive run: FAILED, never started.
func TestWorkerWithoutALiveAPIRefusesALiveRun(t *testing.T) {
	f := newFixture(t)
	a := assignment("live2", "echo")
	a.KeepAlive = true
	f.cp.Enqueue(a)
	_, stop := f.start(t)
	info := f.final(t, "live2")
	assert.Equal(t, model.StatusFailed, info.Status)
	assert.Contains(t, info.Reason, "serves no live runs")
	require.NoError(t, stop())
}
