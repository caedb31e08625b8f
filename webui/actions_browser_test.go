package webui_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/controlplane/sqlite"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/webui"
)

const (
	actUserToken  = "webui-act-user-token-0123456789"
	actOtherToken = "webui-act-other-token-0123456789"
)

// actionsControlPlane is a control plane (no worker) serving the interface
// with APIActions, as taskrun serve mounts it.
func actionsControlPlane(t *testing.T) (*httptest.Server, *sqlite.Store) {
	t.Helper()
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "cp.db"))
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	var tokens server.Tokens
	require.NoError(t, tokens.AddWorker(server.DefaultWorker, e2eWorkerToken))
	require.NoError(t, tokens.AddUser("alice", actUserToken))
	require.NoError(t, tokens.AddUser("mallory", actOtherToken))
	actions := &webui.APIActions{}
	ui, err := webui.New(&webui.ControlPlaneSource{Control: store}, webui.Options{Base: "/ui", Actions: actions,
		Tenant: func(r *http.Request) (string, bool) { return server.UserFromContext(r.Context()) }})
	require.NoError(t, err)
	srv, err := server.New(server.Config{Store: store, Tokens: &tokens, LeaseTTL: time.Minute, Log: slog.New(slog.DiscardHandler), UI: ui})
	require.NoError(t, err)
	actions.API = srv.Handler()
	hs := httptest.NewServer(webui.BrowserSignIn(srv.Handler(), "/ui/"))
	t.Cleanup(hs.Close)
	return hs, store
}

func runStatus(t *testing.T, store *sqlite.Store, id string) model.RunStatus {
	t.Helper()
	r, err := store.GetRun(context.Background(), id)
	require.NoError(t, err)
	return r.Status
}

// In a browser a user submits a task with the form, lands on its page and
// cancels it with its button; a page of another origin that posts the
// cancel form with the user's credentials is refused and the run stays.
func TestSubmitAndCancelInTheBrowser(t *testing.T) {
	hs, store := actionsControlPlane(t)
	p := newPage(t)
	p.do(t, withBearer(actUserToken), chromedp.Navigate(hs.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#nav-submit")))
	p.do(t, chromedp.Click(chromedp.CSS("#nav-submit")), chromedp.WaitVisible(chromedp.CSS("#submit")),
		chromedp.SendKeys(chromedp.CSS(`#submit textarea[name="prompt"]`), `say <img src=x onerror=taskrunPwned("prompt")>`),
		chromedp.SendKeys(chromedp.CSS(`#submit input[name="image"]`), "127.0.0.1:27500/nu/age:1"),
		chromedp.Click(chromedp.CSS(`#submit button`)),
		chromedp.WaitVisible(chromedp.CSS("#run-status")))
	loc := eval[string](t, p, `location.pathname`)
	require.True(t, strings.HasPrefix(loc, "/ui/runs/r"), loc)
	id := strings.TrimPrefix(loc, "/ui/runs/")
	assert.Contains(t, textOf(t, p, "#run-status"), "QUEUED")
	assert.Contains(t, textOf(t, p, "#image"), "127.0.0.1:27500/nu/age:1")
	run, err := store.GetRun(context.Background(), id)
	require.NoError(t, err)
	assert.Equal(t, "alice", run.Task.UserID)
	assert.Equal(t, `say <img src=x onerror=taskrunPwned("prompt")>`, run.Task.Prompt)

	// Another origin's page posts the cancel form: without the token it
	// cannot read, with a guessed one. The browser sends the user's
	// credentials along (as it would Basic ones); the run stays queued.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		field := ""
		if r.URL.Query().Get("guess") != "" {
			field = `<input type="hidden" name="csrf" value="` + strings.Repeat("a", 64) + `">`
		}
		fmt.Fprintf(w, `<!doctype html><form method="post" action="%s/ui/runs/%s/cancel">%s</form><script>document.forms[0].submit()</script>`, hs.URL, url.PathEscape(id), field)
	}))
	t.Cleanup(evil.Close)
	attacker := newPage(t)
	for _, q := range []string{"", "?guess=1"} {
		attacker.do(t, withBearer(actUserToken), chromedp.Navigate(evil.URL+"/"+q))
		require.Eventually(t, func() bool {
			l, err := chromedp.Run(attacker.ctx, chromedp.Evaluate[string](`location.href`))
			return err == nil && strings.HasPrefix(l, hs.URL)
		}, 30*time.Second, 50*time.Millisecond, "the attacker's form was never sent")
		assert.Contains(t, waitText(t, attacker, "main", "Forbidden"), "Forbidden")
		assert.Equal(t, model.StatusQueued, runStatus(t, store, id), "a cross-origin form cancelled the run (%s)", q)
	}

	// The other tenant, with a valid token of its own, cannot cancel it.
	jar, tok := signedIn(t, hs.URL, actOtherToken)
	req, err := http.NewRequest(http.MethodPost, hs.URL+"/ui/runs/"+id+"/cancel", strings.NewReader(url.Values{"csrf": {tok}}.Encode()))
	require.NoError(t, err)
	req.SetBasicAuth("x", actOtherToken)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", hs.URL)
	resp, err := jar.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, model.StatusQueued, runStatus(t, store, id))

	// The owner cancels it with the button.
	p.do(t, chromedp.Navigate(hs.URL+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("#cancel")),
		chromedp.Click(chromedp.CSS("#cancel button")))
	waitText(t, p, "#run-status", "CANCELLED")
	assert.Equal(t, model.StatusCancelled, runStatus(t, store, id))
	assert.Zero(t, count(t, p, "#cancel"), "a finished run has no cancel button")
	assert.Empty(t, p.Fired())
	assert.Empty(t, attacker.Fired())
}

// A refused submission shows the control plane's reason on the form, with
// what was typed kept.
func TestSubmitShowsTheRefusal(t *testing.T) {
	hs, _ := actionsControlPlane(t)
	p := newPage(t)
	p.do(t, withBearer(actUserToken), chromedp.Navigate(hs.URL+"/ui/submit"), chromedp.WaitVisible(chromedp.CSS("#submit")),
		chromedp.SendKeys(chromedp.CSS(`#submit textarea[name="prompt"]`), "p"),
		chromedp.SendKeys(chromedp.CSS(`#submit input[name="image"]`), "Not An <Image>"),
		chromedp.Click(chromedp.CSS(`#submit button`)))
	msg := textOf(t, p, "#submit-error")
	assert.Contains(t, msg, "Not An <Image>", "the reason names the image, as text")
	assert.Equal(t, "Not An <Image>", eval[string](t, p, `document.querySelector('#submit input[name="image"]').value`))
	list, err := http.NewRequest(http.MethodGet, hs.URL+"/v1/runs", nil)
	require.NoError(t, err)
	list.Header.Set("Authorization", "Bearer "+actUserToken)
	resp, err := http.DefaultClient.Do(list)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.NotContains(t, string(body), `"id"`, "nothing was submitted")
}

// signedIn is a browser of the user of token that opened the submit form:
// its cookie jar holds the form token, which it returns.
func signedIn(t *testing.T, base, token string) (*http.Client, string) {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequest(http.MethodGet, base+"/ui/submit", nil)
	require.NoError(t, err)
	req.SetBasicAuth("x", token)
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	u, err := url.Parse(base + "/ui/")
	require.NoError(t, err)
	for _, ck := range jar.Cookies(u) {
		if ck.Name == webui.CSRFCookie {
			return c, ck.Value
		}
	}
	t.Fatal("the submit page set no token cookie")
	return nil, ""
}
