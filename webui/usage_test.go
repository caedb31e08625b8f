package webui_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/sqlite"
	"github.com/taskrun/taskrun/model"
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

// A live run's page shows its usage at the last live sample, asked of its
// worker through the control plane, until its record has the final one.
func TestRunPageShowsLiveUsage(t *testing.T) {
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "cp.db"))
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	now := time.Now()
	_, err = store.CreateTask(ctx, controlplane.NewTask{Task: model.Task{ID: "t1", UserID: "u1", ConversationID: "c", Prompt: "p"},
		RunID: "live1", SessionID: "s", Spec: controlplane.TaskSpec{KeepAlive: true}, CreatedAt: now})
	require.NoError(t, err)
	run, err := store.Lease(ctx, controlplane.LeaseOffer{WorkerID: "w1", Holder: "w", TokenHash: [32]byte{1}, Now: now, TTL: time.Minute,
		Fits: func(controlplane.Run) bool { return true }})
	require.NoError(t, err)
	require.NotNil(t, run)
	var asked []string
	src := &webui.ControlPlaneSource{Control: store, LiveUsage: func(_ context.Context, r controlplane.Run) (*sandbox.Usage, error) {
		asked = append(asked, r.ID)
		return &sandbox.Usage{CPUSeconds: 1.25, PeakMemoryBytes: 3 << 20, ReadBytes: 1 << 10, WriteBytes: 2 << 10, PeakPids: 5, Samples: 2}, nil
	}}
	h, err := webui.New(src, webui.Options{})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, body := get(t, srv.URL+"/runs/live1")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `<dd id="usage">CPU 1.25 s; peak memory 3.0 MiB; I/O 1.0 KiB read, 2.0 KiB written; peak 5 processes</dd>`)
	assert.Equal(t, []string{"live1"}, asked)
}
