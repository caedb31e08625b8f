package daemon_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// attached is a daemon on a fake backend with one attached run, its home
// made, and its live handler.
func attached(t *testing.T, maxIdle time.Duration, onIdle func()) (http.Handler, string, context.CancelFunc, <-chan struct{}) {
	t.Helper()
	ctx := context.Background()
	store, err := persist.Open(ctx, "mem://")
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	root := t.TempDir()
	host, err := executor.New(ctx, executor.Config{Root: root, Store: store, Backend: sandboxfake.New(),
		Defaults: executor.Defaults{Image: "fake/agent", Timeout: time.Minute, DiskLimitBytes: -1, MaxOutputBytes: 1 << 20,
			Policy: sandbox.DefaultPolicy()}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = host.Close(ctx) })
	s, err := daemon.New(daemon.Config{Host: host, MaxIdle: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ref := persist.RunRef{UserID: "alice", ConversationID: "c", TaskID: "t", RunID: "r1"}
	home := host.Layout().Paths().RuntimeTaskRunHomeDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID)
	require.NoError(t, os.MkdirAll(home, 0o755))
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	cancelled := make(chan struct{})
	a, err := s.Attach(runCtx, daemon.AttachOptions{Ref: ref, Ports: []int{8080}, MaxIdle: maxIdle, OnIdle: onIdle,
		Cancel: func() { cancel(); close(cancelled) }})
	require.NoError(t, err)
	t.Cleanup(a.Detach)
	_, err = s.Attach(runCtx, daemon.AttachOptions{Ref: ref, Cancel: cancel})
	require.Error(t, err, "a run is attached once")
	return s.LiveHandler("s3cret"), home, cancel, cancelled
}

func liveCall(t *testing.T, h http.Handler, method, path, secret string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

// The live handler answers the holder of its secret only; an attached
// run's files are read through an os.Root on its home: a traversal or a
// symlink (the agent's own) out of it is refused, and a file outside is
// never read.
func TestLiveHandlerFilesOfAnAttachedRun(t *testing.T) {
	h, home, _, _ := attached(t, 0, nil)
	outside := filepath.Join(t.TempDir(), "secret.txt")
	require.NoError(t, os.WriteFile(outside, []byte("host secret"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(home, "a.txt"), []byte("hello"), 0o644))
	require.NoError(t, os.Symlink(outside, filepath.Join(home, "link")))
	require.NoError(t, os.Symlink("/", filepath.Join(home, "root")))
	require.NoError(t, os.Mkdir(filepath.Join(home, "sub"), 0o755))

	for _, secret := range []string{"", "wrong", "s3cre"} {
		code, _ := liveCall(t, h, "GET", "/v1/runs/r1/files?path=a.txt", secret)
		assert.Equal(t, http.StatusUnauthorized, code, "secret %q", secret)
	}
	code, body := liveCall(t, h, "GET", "/v1/runs/r1/files?path=a.txt", "s3cret")
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "hello", body)
	code, body = liveCall(t, h, "GET", "/v1/runs/r1/files?path=.&op=list", "s3cret")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"name":"a.txt"`)
	code, body = liveCall(t, h, "GET", "/v1/runs/r1/ports", "s3cret")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"path":"/v1/runs/r1/ports/8080/"`)

	for _, p := range []string{"../../../../etc/passwd", "link", "root/etc/passwd", "sub/../../x"} {
		code, body := liveCall(t, h, "GET", "/v1/runs/r1/files?path="+p, "s3cret")
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", p, body)
		assert.NotContains(t, body, "host secret")
		assert.NotContains(t, body, home, "the answer names no host path")
	}
	code, _ = liveCall(t, h, "GET", "/v1/runs/r1/files?path=root&op=list", "s3cret")
	assert.Equal(t, http.StatusBadRequest, code)
	code, _ = liveCall(t, h, "DELETE", "/v1/runs/r1/files?path=link", "s3cret")
	assert.Equal(t, http.StatusNoContent, code, "removing the symlink itself is the run's business")
	_, err := os.Stat(outside)
	assert.NoError(t, err, "the symlink's target is untouched")
	code, _ = liveCall(t, h, "GET", "/v1/runs/r2/files?path=a.txt", "s3cret")
	assert.Equal(t, http.StatusNotFound, code)
}

// An attached run no call touched for its idle timeout is handed to its
// OnIdle, else cancelled.
func TestAttachedRunIdle(t *testing.T) {
	idle := make(chan struct{})
	attached(t, 50*time.Millisecond, func() { close(idle) })
	select {
	case <-idle:
	case <-time.After(time.Minute):
		t.Fatal("OnIdle was never called")
	}
	_, _, _, cancelled := attached(t, 50*time.Millisecond, nil)
	select {
	case <-cancelled:
	case <-time.After(time.Minute):
		t.Fatal("the idle run was never cancelled")
	}
}
