package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
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
	s, host := fakeDaemon(t)
	ref := persist.RunRef{UserID: "alice", ConversationID: "c", TaskID: "t", RunID: "r1"}
	home := host.Layout().Paths().RuntimeTaskRunHomeDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID)
	require.NoError(t, os.MkdirAll(home, 0o755))
	runCtx, cancel := context.WithCancel(context.Background())
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

// fakeDaemon is a daemon on a host of the fake backend.
func fakeDaemon(t *testing.T) (*daemon.Server, *executor.Host) {
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
	return s, host
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

// watchStream opens a watch of p on the live handler's server; its
// first line ("watching") is read.
func watchStream(t *testing.T, ctx context.Context, url, p string) (*http.Response, *bufio.Scanner) {
	t.Helper()
	return watchRun(t, ctx, url, "r1", p)
}

// watchRun is watchStream on the run runID.
func watchRun(t *testing.T, ctx context.Context, url, runID, p string) (*http.Response, *bufio.Scanner) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/runs/"+runID+"/files?op=watch&path="+p, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		return resp, nil
	}
	sc := bufio.NewScanner(resp.Body)
	require.True(t, sc.Scan(), "the watch's first line")
	var e daemon.WatchEvent
	require.NoError(t, json.Unmarshal(sc.Bytes(), &e))
	require.Equal(t, "watching", e.Event)
	return resp, sc
}

// nextEvent reads the watch's events until want; the watch ending first
// fails the test.
func nextEvent(t *testing.T, sc *bufio.Scanner, want daemon.WatchEvent) {
	t.Helper()
	var seen []daemon.WatchEvent
	for sc.Scan() {
		var e daemon.WatchEvent
		require.NoError(t, json.Unmarshal(sc.Bytes(), &e))
		if e == want {
			return
		}
		seen = append(seen, e)
	}
	t.Fatalf("the watch ended without %+v; it saw %+v", want, seen)
}

// A watch streams the creation, modification and removal of a path's
// entries under the run's home, and its own removal, which ends it; a
// traversal or a symlink out of the home is refused, a run's watches are
// bounded, and a watch ends with its run.
func TestLiveHandlerWatchesFiles(t *testing.T) {
	h, home, cancelRun, _ := attached(t, 0, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	outside := t.TempDir()
	require.NoError(t, os.Symlink(outside, filepath.Join(home, "out")))
	require.NoError(t, os.Symlink("/", filepath.Join(home, "root")))
	require.NoError(t, os.Mkdir(filepath.Join(home, "sub"), 0o755))

	_, sc := watchStream(t, ctx, srv.URL, "sub")
	require.NoError(t, os.WriteFile(filepath.Join(home, "sub", "a.txt"), []byte("x"), 0o644))
	nextEvent(t, sc, daemon.WatchEvent{Event: "created", Path: "sub/a.txt"})
	nextEvent(t, sc, daemon.WatchEvent{Event: "modified", Path: "sub/a.txt"})
	require.NoError(t, os.Mkdir(filepath.Join(home, "sub", "d"), 0o755))
	nextEvent(t, sc, daemon.WatchEvent{Event: "created", Path: "sub/d", Dir: true})
	require.NoError(t, os.Remove(filepath.Join(home, "sub", "a.txt")))
	nextEvent(t, sc, daemon.WatchEvent{Event: "removed", Path: "sub/a.txt"})
	require.NoError(t, os.RemoveAll(filepath.Join(home, "sub")))
	nextEvent(t, sc, daemon.WatchEvent{Event: "removed", Path: "sub"})
	assert.False(t, sc.Scan(), "the watch ends with its path")

	for _, p := range []string{"out", "root", "root/etc", "../..", "sub/../../x"} {
		resp, _ := watchStream(t, ctx, srv.URL, p)
		b, _ := io.ReadAll(resp.Body)
		assert.Contains(t, []int{http.StatusBadRequest, http.StatusNotFound}, resp.StatusCode, "%s: %s", p, b)
		assert.NotContains(t, string(b), home, "the answer names no host path")
	}

	var open []*bufio.Scanner
	for range daemon.MaxWatchesPerRun {
		_, sc := watchStream(t, ctx, srv.URL, ".")
		require.NotNil(t, sc)
		open = append(open, sc)
	}
	resp, _ := watchStream(t, ctx, srv.URL, ".")
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	cancelRun()
	for _, sc := range open {
		for sc.Scan() {
		}
		require.NoError(t, sc.Err(), "the watch ends with its run")
	}
}

// The daemon's watches are bounded over all its runs, each within its own
// bound, so that runs together cannot take the inotify instances the
// daemon's user has.
func TestLiveHandlerBoundsTheDaemonsWatches(t *testing.T) {
	s, host := fakeDaemon(t)
	runs := daemon.MaxWatches/daemon.MaxWatchesPerRun + 1
	for i := range runs {
		ref := persist.RunRef{UserID: "alice", ConversationID: "c", TaskID: "t", RunID: fmt.Sprintf("r%d", i)}
		home := host.Layout().Paths().RuntimeTaskRunHomeDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID)
		require.NoError(t, os.MkdirAll(home, 0o755))
		runCtx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		a, err := s.Attach(runCtx, daemon.AttachOptions{Ref: ref, Cancel: cancel})
		require.NoError(t, err)
		t.Cleanup(a.Detach)
	}
	srv := httptest.NewServer(s.LiveHandler("s3cret"))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	opened := 0
	for i := range runs - 1 {
		for range daemon.MaxWatchesPerRun {
			resp, sc := watchRun(t, ctx, srv.URL, fmt.Sprintf("r%d", i), ".")
			require.NotNil(t, sc, "watch %d: %d", opened, resp.StatusCode)
			opened++
		}
	}
	require.Equal(t, daemon.MaxWatches, opened)
	last := fmt.Sprintf("r%d", runs-1)
	resp, _ := watchRun(t, ctx, srv.URL, last, ".")
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "a run with no watch of its own is refused once the daemon holds its bound: %s", b)
}
