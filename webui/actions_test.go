package webui_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/webui"
)

// fakeActions records what the interface asked of the control plane.
type fakeActions struct {
	mu        sync.Mutex
	submitted []controlplane.SubmitRequest
	cancelled []string
	resumed   []string
	forked    []string
}

func (f *fakeActions) Fork(_ *http.Request, id string, n int, prompt string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forked = append(f.forked, fmt.Sprintf("%s n=%d prompt=%q", id, n, prompt))
	return []string{"f1"}, nil
}

func (f *fakeActions) Resume(_ *http.Request, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resumed = append(f.resumed, id)
	return nil
}

func (f *fakeActions) Submit(_ *http.Request, req controlplane.SubmitRequest) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.submitted = append(f.submitted, req)
	return "r1", nil
}

func (f *fakeActions) Cancel(_ *http.Request, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancelled = append(f.cancelled, id)
	return nil
}

func (f *fakeActions) calls() (int, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.submitted), append([]string(nil), f.cancelled...)
}

// actionServer serves the interface with actions over a store holding
// u1's run r1 and u2's run r2; X-Test-User names the request's tenant.
func actionServer(t *testing.T) (*httptest.Server, *fakeActions) {
	t.Helper()
	st, _ := storeWithRun(t)
	putRun(t, st, "u2", "r2")
	acts := &fakeActions{}
	h, err := webui.New(&webui.StoreSource{Store: st}, webui.Options{Base: "/ui", Actions: acts, Tenant: func(r *http.Request) (string, bool) {
		u := r.Header.Get("X-Test-User")
		return u, u != ""
	}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, acts
}

// formClient is a browser of user: its cookie jar holds the token the
// submit page set, which it returns.
func formClient(t *testing.T, srv *httptest.Server, user string) (*http.Client, string) {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/ui/submit", nil)
	require.NoError(t, err)
	req.Header.Set("X-Test-User", user)
	resp, err := c.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	u, _ := url.Parse(srv.URL + "/ui/")
	var tok string
	for _, ck := range jar.Cookies(u) {
		if ck.Name == webui.CSRFCookie {
			tok = ck.Value
		}
	}
	require.NotEmpty(t, tok, "the submit page sets the token cookie")
	assert.Contains(t, string(body), `name="csrf" value="`+tok+`"`, "the form carries the token")
	for _, sc := range resp.Header.Values("Set-Cookie") {
		assert.Contains(t, sc, "HttpOnly", sc)
		assert.Contains(t, sc, "SameSite=Strict", sc)
	}
	return c, tok
}

// post sends a form as user with the given Origin ("" for none).
func post(t *testing.T, c *http.Client, user, target, origin string, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Test-User", user)
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// A form is carried out only with the browser's token and from the
// interface's own origin: without the token, with another's, from another
// origin or with no origin at all it is refused and nothing is done.
func TestFormsRefuseCrossSiteRequests(t *testing.T) {
	srv, acts := actionServer(t)
	c, tok := formClient(t, srv, "u1")
	cancel := srv.URL + "/ui/runs/r1/cancel"

	code, body := post(t, c, "u1", cancel, srv.URL, url.Values{})
	assert.Equal(t, http.StatusForbidden, code, "no token: %s", body)
	code, _ = post(t, c, "u1", cancel, srv.URL, url.Values{"csrf": {strings.Repeat("0", 64)}})
	assert.Equal(t, http.StatusForbidden, code, "another token")
	code, _ = post(t, c, "u1", cancel, "http://evil.example", url.Values{"csrf": {tok}})
	assert.Equal(t, http.StatusForbidden, code, "a cross Origin, even with the token")
	code, _ = post(t, c, "u1", cancel, "null", url.Values{"csrf": {tok}})
	assert.Equal(t, http.StatusForbidden, code, "an opaque Origin")
	code, _ = post(t, c, "u1", cancel, "", url.Values{"csrf": {tok}})
	assert.Equal(t, http.StatusForbidden, code, "no Origin and no Sec-Fetch-Site")
	// A client without the cookie (a page that knows a token but cannot
	// set our cookie) is refused too.
	bare := &http.Client{CheckRedirect: c.CheckRedirect}
	code, _ = post(t, bare, "u1", cancel, srv.URL, url.Values{"csrf": {tok}})
	assert.Equal(t, http.StatusForbidden, code, "a token without its cookie")
	code, _ = post(t, c, "u1", srv.URL+"/ui/submit", "http://evil.example", url.Values{"csrf": {tok}, "prompt": {"x"}})
	assert.Equal(t, http.StatusForbidden, code, "submit from a cross Origin")
	code, _ = post(t, c, "u1", srv.URL+"/ui/submit", srv.URL, url.Values{"prompt": {"x"}})
	assert.Equal(t, http.StatusForbidden, code, "submit without the token")
	n, cancelled := acts.calls()
	assert.Zero(t, n, "nothing was submitted")
	assert.Empty(t, cancelled, "nothing was cancelled")

	code, _ = post(t, c, "u1", cancel, srv.URL, url.Values{"csrf": {tok}})
	assert.Equal(t, http.StatusSeeOther, code, "the user's own form")
	code, _ = post(t, c, "u1", srv.URL+"/ui/submit", srv.URL, url.Values{"csrf": {tok}, "prompt": {"do it"}, "image": {"reg.example/a:1"}, "command": {"sh\r\n-c\r\necho hi\r\n"}})
	assert.Equal(t, http.StatusSeeOther, code)
	n, cancelled = acts.calls()
	assert.Equal(t, []string{"r1"}, cancelled)
	require.Equal(t, 1, n)
	assert.Equal(t, controlplane.SubmitRequest{Prompt: "do it", Image: "reg.example/a:1", Command: []string{"sh", "-c", "echo hi"}}, acts.submitted[0])
}

// A tenant cannot cancel another tenant's run: it is not found, as on
// every page, and the control plane is never asked.
func TestCancelOnlyOwnRuns(t *testing.T) {
	srv, acts := actionServer(t)
	c, tok := formClient(t, srv, "u1")
	code, body := post(t, c, "u1", srv.URL+"/ui/runs/r2/cancel", srv.URL, url.Values{"csrf": {tok}})
	assert.Equal(t, http.StatusNotFound, code, body)
	code, _ = post(t, c, "", srv.URL+"/ui/runs/r1/cancel", srv.URL, url.Values{"csrf": {tok}})
	assert.Equal(t, http.StatusNotFound, code, "a request without a tenant")
	_, cancelled := acts.calls()
	assert.Empty(t, cancelled)
}

// Without Actions the interface stays read-only: no form, no POST route.
func TestReadOnlyWithoutActions(t *testing.T) {
	st, _ := storeWithRun(t)
	h, err := webui.New(&webui.StoreSource{Store: st}, webui.Options{})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, body := get(t, srv.URL+"/")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.NotContains(t, body, "/submit")
	resp, err = http.Post(srv.URL+"/runs/r1/cancel", "application/x-www-form-urlencoded", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Contains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, resp.StatusCode, "no such route")
}

// A paused run's page offers its owner resume and fork forms carrying the token;
// each is carried out only with the token, from the interface's own
// origin, and for the tenant's own run (another's is not found, and the
// control plane is never asked). A finished run offers neither; a fork shows
// its first fork, whose page names its parent.
func TestResumeAndForkOnlyOwnPausedRunsWithTheToken(t *testing.T) {
	st, _ := storeWithRun(t)
	putRun(t, st, "u2", "r2")
	rec := putRun(t, st, "u1", "p1")
	rec.Status, rec.End = model.StatusPaused, time.Time{}
	_, err := runindex.Put(context.Background(), st, &rec)
	require.NoError(t, err)
	acts := &fakeActions{}
	h, err := webui.New(&webui.StoreSource{Store: st}, webui.Options{Base: "/ui", Actions: acts, Tenant: func(r *http.Request) (string, bool) {
		u := r.Header.Get("X-Test-User")
		return u, u != ""
	}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, tok := formClient(t, srv, "u1")

	page := func(id string) string {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/ui/runs/"+id, nil)
		require.NoError(t, err)
		req.Header.Set("X-Test-User", "u1")
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		return string(b)
	}
	body := page("p1")
	assert.Contains(t, body, `action="/ui/runs/p1/resume"`)
	assert.Contains(t, body, `name="csrf" value="`+tok+`"`)
	assert.NotContains(t, page("r1"), "/resume", "a finished run offers no resume")

	resume := srv.URL + "/ui/runs/p1/resume"
	code, _ := post(t, c, "u1", resume, srv.URL, url.Values{})
	assert.Equal(t, http.StatusForbidden, code, "no token")
	code, _ = post(t, c, "u1", resume, "http://evil.example", url.Values{"csrf": {tok}})
	assert.Equal(t, http.StatusForbidden, code, "a cross Origin")
	code, _ = post(t, c, "u1", srv.URL+"/ui/runs/r2/resume", srv.URL, url.Values{"csrf": {tok}})
	assert.Equal(t, http.StatusNotFound, code, "another tenant's run")
	acts.mu.Lock()
	assert.Empty(t, acts.resumed, "nothing was resumed")
	acts.mu.Unlock()

	code, _ = post(t, c, "u1", resume, srv.URL, url.Values{"csrf": {tok}})
	assert.Equal(t, http.StatusSeeOther, code)
	acts.mu.Lock()
	assert.Equal(t, []string{"p1"}, acts.resumed)
	acts.mu.Unlock()

	// The fork form: the same checks, then the first fork is shown.
	assert.Contains(t, body, `action="/ui/runs/p1/fork"`)
	assert.NotContains(t, page("r1"), "/fork", "only a paused run's page offers a fork")
	fork := srv.URL + "/ui/runs/p1/fork"
	code, _ = post(t, c, "u1", fork, srv.URL, url.Values{"n": {"2"}})
	assert.Equal(t, http.StatusForbidden, code, "fork without the token")
	code, _ = post(t, c, "u1", fork, "http://evil.example", url.Values{"csrf": {tok}, "n": {"2"}})
	assert.Equal(t, http.StatusForbidden, code, "fork from a cross Origin")
	code, _ = post(t, c, "u1", srv.URL+"/ui/runs/r2/fork", srv.URL, url.Values{"csrf": {tok}, "n": {"2"}})
	assert.Equal(t, http.StatusNotFound, code, "fork another tenant's run")
	code, _ = post(t, c, "u1", fork, srv.URL, url.Values{"csrf": {tok}, "n": {"0"}})
	assert.Equal(t, http.StatusBadRequest, code, "no forks")
	acts.mu.Lock()
	assert.Empty(t, acts.forked, "nothing was forked")
	acts.mu.Unlock()
	req, err := http.NewRequest(http.MethodPost, fork, strings.NewReader(url.Values{"csrf": {tok}, "n": {"2"}, "prompt": {"again"}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Test-User", "u1")
	req.Header.Set("Origin", srv.URL)
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/ui/runs/f1", resp.Header.Get("Location"), "the first fork is shown")
	acts.mu.Lock()
	assert.Equal(t, []string{`p1 n=2 prompt="again"`}, acts.forked)
	acts.mu.Unlock()

	// A fork's page names its parent.
	child := putRun(t, st, "u1", "f1")
	child.ParentRunID = "p1"
	_, err = runindex.Put(context.Background(), st, &child)
	require.NoError(t, err)
	assert.Contains(t, page("f1"), `<dd id="parent"><a href="/ui/runs/p1">p1</a></dd>`)
}
