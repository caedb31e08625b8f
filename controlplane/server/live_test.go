package server_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// fakeLive is a worker's live API that records the calls it got.
type fakeLive struct {
	mu    sync.Mutex
	calls []*http.Request
}

func (f *fakeLive) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.calls = append(f.calls, r.Clone(context.Background()))
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if strings.HasSuffix(r.URL.Path, "/usage") {
		_, _ = io.WriteString(w, `{"cpu_seconds":1.5,"peak_memory_bytes":4096,"samples":3}`)
		return
	}
	_, _ = io.WriteString(w, `{"path":"`+r.URL.Path+`"}`)
}

func (f *fakeLive) last() *http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return nil
	}
	return f.calls[len(f.calls)-1]
}

// TestLiveAPIProxy: a live run's API calls reach the worker that holds it
// with the worker's secret and the caller's name, never the user's token;
// another tenant gets 404 on every call, as does a run that does not
// exist; a run that is not live, or not RUNNING, is 409.
func TestLiveAPIProxy(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	fake := &fakeLive{}
	ws := httptest.NewServer(fake)
	t.Cleanup(ws.Close)

	_, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p", Ports: []int{8000}}, nil)
	assertClientStatus(t, err, http.StatusBadRequest) // ports only on a live run
	_, err = e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p", KeepAlive: true, Ports: []int{70000}}, nil)
	assertClientStatus(t, err, http.StatusBadRequest)

	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "live", KeepAlive: true, IdleTimeoutMillis: 5000, Ports: []int{8000}}, nil)
	require.NoError(t, err)
	a, err := e.worker.AcquireLease(ctx, workerclient.LeaseRequest{WorkerID: "host-a/1",
		Capacity: workerclient.Capacity{Slots: 2, FreeSlots: 2}, Labels: labels,
		Live: &workerclient.LiveEndpoint{URL: ws.URL, Secret: "s3cret"}})
	require.NoError(t, err)
	require.NotNil(t, a)
	assert.True(t, a.KeepAlive)
	assert.Equal(t, int64(5000), a.IdleTimeoutMillis)
	assert.Equal(t, []int{8000}, a.Ports)

	run := e.url + "/v1/runs/" + sub.RunID
	start := e.clock.Now().UnixMilli()
	require.NoError(t, e.worker.Fenced(a.Lease).UpdateRunStatus(ctx, a.Run.ID,
		&workerclient.PatchTaskRunRequest{Status: model.StatusRunning, StartedAt: &start}))

	calls := []struct{ method, path string }{
		{"POST", "/exec"}, {"POST", "/processes"}, {"GET", "/processes"}, {"GET", "/processes/p1"},
		{"GET", "/processes/p1/output?offset=3"}, {"POST", "/processes/p1/stdin"}, {"POST", "/processes/p1/signal"},
		{"GET", "/usage"}, {"GET", "/files?path=a.txt"}, {"PUT", "/files?path=a.txt"}, {"DELETE", "/files?path=a.txt"},
		{"GET", "/ports"}, {"GET", "/ports/8000/x/y"},
	}
	for _, c := range calls {
		code, body := do(t, c.method, run+c.path, bobToken, "", strings.NewReader("{}"))
		assert.Equal(t, http.StatusNotFound, code, "another tenant: %s %s: %s", c.method, c.path, body)
		code, body = do(t, c.method, e.url+"/v1/runs/r-nope"+c.path, userToken, "", strings.NewReader("{}"))
		assert.Equal(t, http.StatusNotFound, code, "no such run: %s %s: %s", c.method, c.path, body)
	}
	assert.Nil(t, fake.last(), "no refused call reached the worker")

	for _, c := range calls {
		req, err := http.NewRequest(c.method, run+c.path, strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+userToken)
		req.Header.Set("Cookie", "session=x")
		req.Header.Set(daemon.PortTokenHeader, "port-tok")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s", c.method, c.path)
		got := fake.last()
		require.NotNil(t, got)
		path, query, _ := strings.Cut(c.path, "?")
		assert.Equal(t, c.method, got.Method)
		assert.Equal(t, "/v1/runs/"+sub.RunID+path, got.URL.Path)
		assert.Equal(t, query, got.URL.RawQuery)
		assert.Equal(t, "Bearer s3cret", got.Header.Get("Authorization"), "the worker hears the control plane's secret, not the user's token")
		assert.Empty(t, got.Header.Get("Cookie"))
		assert.Equal(t, "user alice through taskrun serve", got.Header.Get(daemon.CallerHeader))
		assert.Equal(t, "port-tok", got.Header.Get(daemon.PortTokenHeader), "the port's token is the worker's to check")
	}

	// The web interface's view of its usage, asked of the worker.
	got, err := e.store.GetRun(ctx, sub.RunID)
	require.NoError(t, err)
	u, err := e.srv.LiveUsage(ctx, got)
	require.NoError(t, err)
	require.NotNil(t, u)
	assert.Equal(t, 1.5, u.CPUSeconds)
	assert.Equal(t, "Bearer s3cret", fake.last().Header.Get("Authorization"))

	// A run that is not live has no live API.
	plain, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "plain"}, nil)
	require.NoError(t, err)
	code, _ := do(t, "GET", e.url+"/v1/runs/"+plain.RunID+"/processes", userToken, "", nil)
	assert.Equal(t, http.StatusConflict, code)
	got, err = e.store.GetRun(ctx, plain.RunID)
	require.NoError(t, err)
	u, err = e.srv.LiveUsage(ctx, got)
	assert.NoError(t, err)
	assert.Nil(t, u)
}
