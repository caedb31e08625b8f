package docker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
)

// engineAnswering is a Backend whose engine answers every request with
// status and the engine's JSON error message msg, through the real client.
func engineAnswering(t *testing.T, status int, msg string) *Backend {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"message":"` + msg + `"}`))
	}))
	t.Cleanup(srv.Close)
	c, err := client.NewClientWithOpts(client.WithHost("tcp://"+strings.TrimPrefix(srv.URL, "http://")), client.WithVersion("1.41"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &Backend{api: sdkClient{c}, log: slog.Default(), stopGrace: time.Second, now: time.Now, live: map[string]*handle{}}
}

// The log of a container the engine marked dead or for removal is refused
// with a conflict (Docker 20.10: "can not get logs from container which is
// dead or marked for removal"); a container removed meanwhile is not
// found. Both are the container being gone, which recovery treats as such,
// rather than an error that fails `taskrun gc`. Any other refusal is not.
func TestOrphanLogsOfAContainerBeingRemovedIsGone(t *testing.T) {
	for _, c := range []struct {
		status int
		msg    string
		gone   bool
	}{
		{http.StatusConflict, "can not get logs from container which is dead or marked for removal", true},
		{http.StatusNotFound, "No such container: 0123456789ab", true},
		{http.StatusInternalServerError, "something else broke", false},
	} {
		b := engineAnswering(t, c.status, c.msg)
		var stdout, stderr bytes.Buffer
		err := b.OrphanLogs(context.Background(), "0123456789abcdef", &stdout, &stderr)
		require.Error(t, err, c.msg)
		assert.Equal(t, c.gone, errors.Is(err, sandbox.ErrContainerGone), "%d %s: %v", c.status, c.msg, err)
		assert.Contains(t, err.Error(), c.msg, "the engine's words are kept")
	}
}
