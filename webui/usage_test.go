package webui_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/webui"
)

// The run page shows the resource usage of the run's index record, and
// says so when the run's usage was not sampled.
func TestRunPageShowsResourceUsage(t *testing.T) {
	st, err := persist.Open(context.Background(), "mem://")
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	putRun(t, st, "u1", "plain")
	rec := putRun(t, st, "u1", "sampled")
	rec.Usage = &sandbox.Usage{CPUSeconds: 2.345, PeakMemoryBytes: 67 << 20, ReadBytes: 3 << 10, WriteBytes: 20 << 20, PeakPids: 12, Samples: 4}
	_, err = runindex.Put(context.Background(), st, &rec)
	require.NoError(t, err)

	h, err := webui.New(&webui.StoreSource{Store: st}, webui.Options{})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	resp, body := get(t, srv.URL+"/runs/sampled")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `<dd id="usage">CPU 2.35 s; peak memory 67.0 MiB; I/O 3.0 KiB read, 20.0 MiB written; peak 12 processes</dd>`)
	resp, body = get(t, srv.URL+"/runs/plain")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `<dd id="usage">not sampled</dd>`)
}
