package webui_test

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

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/webui"
)

// storeWithRun is a real in-memory store holding one finished run with an
// artifact whose name and content are markup.
func storeWithRun(t *testing.T) (*persist.Store, runindex.Record) {
	t.Helper()
	st, err := persist.Open(context.Background(), "mem://")
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st, putRun(t, st, "u1", "r1")
}

// putRun stores a finished run of user with an output log and an artifact.
func putRun(t *testing.T, st *persist.Store, user, runID string) runindex.Record {
	t.Helper()
	ctx := context.Background()
	ref := persist.RunRef{UserID: user, ConversationID: "c1", TaskID: "t1", RunID: runID}
	logInfo, err := st.PutRunFile(ctx, ref, "output.log", strings.NewReader("line one\n\x1b[2Jline two\n"), "text/plain")
	require.NoError(t, err)
	art, err := st.PutArtifact(ctx, ref, `dir/<b>x</b>.html`, strings.NewReader("<script>alert(1)</script>"), "text/html")
	require.NoError(t, err)
	exit := 0
	rec := runindex.Record{
		RunID: runID, UserID: user, ConversationID: "c1", TaskID: "t1", Status: model.StatusSucceeded,
		Start: time.Now().Add(-time.Minute).UTC(), End: time.Now().UTC(), ExitCode: &exit,
		Keys: runindex.Keys{Log: logInfo.Key}, Stored: []persist.ObjectInfo{logInfo, art},
	}
	_, err = runindex.Put(ctx, st, &rec)
	require.NoError(t, err)
	return rec
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

// Every answer carries the security headers; artifacts are downloads of
// type application/octet-stream whatever type they were stored with.
func TestHeadersAndDownloads(t *testing.T) {
	st, _ := storeWithRun(t)
	h, err := webui.New(&webui.StoreSource{Store: st}, webui.Options{Base: "/ui"})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	for _, path := range []string{"/ui/", "/ui/runs/r1", "/ui/rules", "/ui/hosts", "/ui/assets/app.js", "/ui/runs/nope"} {
		resp, _ := get(t, srv.URL+path)
		csp := resp.Header.Get("Content-Security-Policy")
		assert.Contains(t, csp, "script-src 'self'", path)
		assert.Contains(t, csp, "default-src 'none'", path)
		assert.Contains(t, csp, "frame-ancestors 'none'", path)
		assert.NotContains(t, csp, "unsafe-inline", path)
		assert.NotContains(t, csp, "unsafe-eval", path)
		assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), path)
	}
	resp, body := get(t, srv.URL+"/ui/runs/nope")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, body, "no run nope")

	resp, body = get(t, srv.URL+"/ui/runs/r1")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, "line one\n^[[2Jline two", "terminal escapes shown as text")
	assert.Contains(t, body, `&lt;b&gt;x&lt;/b&gt;.html`, "the artifact's name is escaped")
	assert.Contains(t, body, `/ui/runs/r1/artifacts/dir/%3Cb%3Ex%3C/b%3E.html`)

	resp, body = get(t, srv.URL+"/ui/runs/r1/artifacts/dir/%3Cb%3Ex%3C/b%3E.html")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "<script>alert(1)</script>", body)
	assert.Equal(t, "application/octet-stream", resp.Header.Get("Content-Type"), "never text/html")
	assert.Equal(t, `attachment; filename=b_.html`, resp.Header.Get("Content-Disposition"), "the last element, made safe")
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "sandbox")

	resp, _ = get(t, srv.URL+"/ui/runs/r1/artifacts/dir/other.html")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "only artifacts the run's record lists")
	resp, _ = get(t, srv.URL+"/ui/?status=bogus")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	resp, body = get(t, srv.URL+"/ui/hosts")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, "keeps no worker host data")
}

// The output endpoint sends a finished run's stored log as escaped text
// events, then the end.
func TestOutputEventsOfAStoredRun(t *testing.T) {
	st, _ := storeWithRun(t)
	h, err := webui.New(&webui.StoreSource{Store: st}, webui.Options{})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, body := get(t, srv.URL+"/runs/r1/output")
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	assert.Equal(t, "event: out\nid: 22\ndata: {\"o\":0,\"d\":\"line one\\n^[[2Jline two\\n\"}\n\nevent: end\ndata: 22\n\n", body)

	resp, body = get(t, srv.URL+"/runs/r1/output?from=9")
	assert.Contains(t, body, `{"o":9,"d":"^[[2Jline two\n"}`)
	resp.Body.Close()
}

// With Options.Tenant a request sees only its tenant's runs: another
// tenant's run is not listed and answers 404 on every path, as a run that
// does not exist does.
func TestTenantScope(t *testing.T) {
	st, _ := storeWithRun(t)
	putRun(t, st, "u2", "r2")
	h, err := webui.New(&webui.StoreSource{Store: st}, webui.Options{Tenant: func(r *http.Request) (string, bool) {
		u := r.Header.Get("X-Test-User")
		return u, u != ""
	}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	as := func(user, path string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		require.NoError(t, err)
		if user != "" {
			req.Header.Set("X-Test-User", user)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}

	code, body := as("u1", "/")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `data-run="r1"`)
	assert.NotContains(t, body, `data-run="r2"`)
	_, body = as("u1", "/?tenant=u2")
	assert.NotContains(t, body, `data-run="r2"`, "a filter naming another tenant shows nothing of it")
	for _, p := range []string{"/runs/r2", "/runs/r2/isolation", "/runs/r2/log", "/runs/r2/output", "/runs/r2/artifacts/dir/%3Cb%3Ex%3C/b%3E.html"} {
		code, body := as("u1", p)
		assert.Contains(t, []int{http.StatusNotFound}, code, p)
		assert.NotContains(t, body, "line one", p)
	}
	code, _ = as("u2", "/runs/r2/log")
	assert.Equal(t, http.StatusOK, code)
	_, body = as("", "/")
	assert.NotContains(t, body, `data-run=`, "a request without a tenant sees no run")
}

// BasicAsBearer passes a Basic password on as the bearer token, and
// challenges a request without credentials.
func TestBasicAsBearer(t *testing.T) {
	var got []string
	srv := httptest.NewServer(webui.BasicAsBearer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") == "Bearer wrong" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="api"`)
			w.WriteHeader(http.StatusUnauthorized)
		}
	})))
	t.Cleanup(srv.Close)
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/ui/", nil)
	require.NoError(t, err)
	req.SetBasicAuth("anyone", "tok-123")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	req.Header.Set("Authorization", "Bearer tok-456")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{"Bearer tok-123", "Bearer tok-456"}, got)

	resp, _ = get(t, srv.URL+"/ui/")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("WWW-Authenticate"), "Basic")
	assert.Len(t, got, 2, "an unauthenticated request never reaches the handler")

	req.Header.Del("Authorization")
	req.SetBasicAuth("anyone", "wrong")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("WWW-Authenticate"), "Basic", "a wrong token is asked for again")
}
