package webui_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/webui"
)

// One tenant holds at most its share of the live connections: past it, it
// gets 429, while another tenant still gets a stream.
func TestLiveStreamsAreCappedPerTenant(t *testing.T) {
	st, _ := storeWithRun(t)
	h, err := webui.New(&webui.StoreSource{Store: st}, webui.Options{MaxStreams: 8, MaxStreamsPerTenant: 2,
		Tenant: func(r *http.Request) (string, bool) {
			u := r.Header.Get("X-Test-User")
			return u, u != ""
		}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	open := func(user string) *http.Response {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/events/runs", nil)
		require.NoError(t, err)
		req.Header.Set("X-Test-User", user)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for range 2 {
		resp := open("mallory")
		require.Equal(t, http.StatusOK, resp.StatusCode)
		// The first event says the stream is live on the server.
		_, err := bufio.NewReader(resp.Body).ReadString('\n')
		require.NoError(t, err)
	}
	over := open("mallory")
	assert.Equal(t, http.StatusTooManyRequests, over.StatusCode)
	assert.NotEmpty(t, over.Header.Get("Retry-After"))
	assert.Equal(t, http.StatusOK, open("alice").StatusCode, "another tenant still gets a stream")
}
