package webui_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/controlplane/sqlite"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/webui"
	"github.com/taskrun/taskrun/workerclient"
)

const (
	e2eWorkerToken = "webui-worker-token-0123456789"
	e2eUserToken   = "webui-user-token-0123456789"
	e2eOtherToken  = "webui-other-token-0123456789"
	e2eWorkerID    = "host-ui/1"
)

// withBearer makes the page send the token with every request, as a
// browser signed in to the control plane does.
func withBearer(token string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if _, err := cdp.Call(ctx, t, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, t, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Bearer " + token}})
		return err
	})
}

// A task submitted through the control plane's API appears in the web
// interface mounted in the control plane, behind its authentication: queued,
// then running with its output streaming in as the worker sends it to the
// control plane, then finished with the records its worker stored.
func TestServeEndToEnd(t *testing.T) {
	f := getFixture(t)
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "cp.db"))
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	var tokens server.Tokens
	require.NoError(t, tokens.AddWorker(server.DefaultWorker, e2eWorkerToken))
	require.NoError(t, tokens.AddUser(f.env.Tenant, e2eUserToken))
	require.NoError(t, tokens.AddUser("someone-else", e2eOtherToken))
	ui, err := webui.New(&webui.ControlPlaneSource{Control: store, Store: f.env.Store, Workers: store}, webui.Options{Base: "/ui", Tenant: func(r *http.Request) (string, bool) { return server.UserFromContext(r.Context()) }})
	require.NoError(t, err)
	srv, err := server.New(server.Config{Store: store, Blobs: f.env.Store, Tokens: &tokens, LeaseTTL: 2 * time.Minute,
		PollInterval: 50 * time.Millisecond, Log: slog.New(slog.DiscardHandler), UI: ui})
	require.NoError(t, err)
	hs := httptest.NewServer(webui.BrowserSignIn(srv.Handler(), "/ui/"))
	t.Cleanup(hs.Close)

	// Unauthenticated: a Basic challenge; Basic with the user's token: in.
	resp, err := http.Get(hs.URL + "/ui/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("WWW-Authenticate"), "Basic")

	user, err := client.New(hs.URL, e2eUserToken, nil)
	require.NoError(t, err)
	sub, err := user.Submit(ctx, controlplane.SubmitRequest{Prompt: "print and wait", Image: testImage, Command: []string{"sh", "-c", `
echo served-first-line
while [ ! -e /taskrun/home/go ]; do sleep 0.1; done
echo served-second-line > /taskrun/home/result.txt
echo served-second-line`}}, nil)
	require.NoError(t, err)

	p := newPage(t)
	p.do(t, withBearer(e2eUserToken), chromedp.Navigate(hs.URL+"/ui/"))
	waitText(t, p, `tr[data-run="`+sub.RunID+`"]`, "QUEUED")

	// The other user sees nothing of it.
	req, err := http.NewRequest(http.MethodGet, hs.URL+"/ui/runs/"+sub.RunID, nil)
	require.NoError(t, err)
	req.SetBasicAuth("x", e2eOtherToken)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, string(body))

	// A worker leases the run and executes it for real.
	worker := workerclient.New(hs.URL, e2eWorkerToken)
	a, err := worker.AcquireLease(ctx, workerclient.LeaseRequest{WorkerID: e2eWorkerID,
		Capacity: workerclient.Capacity{Slots: 2, FreeSlots: 2}, WaitMillis: 5000,
		Labels: workerclient.WorkerLabels{Runtimes: []string{"runc"}, Images: []string{testImage}}})
	require.NoError(t, err)
	require.NotNil(t, a, "the worker got no lease")
	require.Equal(t, sub.RunID, a.Run.ID)
	fenced := worker.Fenced(a.Lease)
	in := f.input(a.Run.ID, a.Image, testbin.Dir(t), a.Command...)
	in.Task = &model.Task{ID: a.Task.ID, UserID: a.Task.UserID, ConversationID: a.Task.ConversationID, Prompt: a.Task.Prompt}
	in.Run = &model.TaskRun{ID: a.Run.ID, TaskID: a.Task.ID}
	in.SessionID = a.SessionID
	in.Updater, in.StreamSender = fenced, fenced.Stream()
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, runErr = taskrun.Execute(runCtx, in)
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	run := newPage(t)
	run.do(t, withBearer(e2eUserToken), chromedp.Navigate(hs.URL+"/ui/runs/"+sub.RunID))
	out := waitText(t, run, "#output", "served-first-line")
	assert.NotContains(t, out, "served-second-line")
	waitText(t, p, `tr[data-run="`+sub.RunID+`"]`, "RUNNING")

	hosts := newPage(t)
	hosts.do(t, withBearer(e2eUserToken), chromedp.Navigate(hs.URL+"/ui/hosts"))
	hostText := waitText(t, hosts, "#hosts", e2eWorkerID)
	assert.Contains(t, hostText, sub.RunID, "the worker's lease")
	assert.Contains(t, hostText, "2 / 2", "the slots of its last heartbeat")
	assert.Contains(t, hostText, "runtimes=runc")

	runDir := f.env.Paths().RuntimeTaskRunDir(a.Task.UserID, a.Task.ConversationID, a.Task.ID, a.Run.ID)
	require.NoError(t, os.WriteFile(filepath.Join(runDir, "home", "go"), nil, 0o644))
	waitText(t, run, "#output", "served-second-line")
	run.do(t, chromedp.WaitReady(chromedp.CSS(`pre[data-ended="true"]`)))
	wg.Wait()
	require.NoError(t, runErr)
	waitText(t, p, `tr[data-run="`+sub.RunID+`"]`, "SUCCEEDED")

	// Once ended, its page shows what the worker stored.
	run.do(t, chromedp.Navigate(hs.URL+"/ui/runs/"+sub.RunID))
	assert.Contains(t, textOf(t, run, "#run-status"), "SUCCEEDED")
	assert.Contains(t, textOf(t, run, "#output"), "served-second-line")
	assert.Contains(t, textOf(t, run, "#changes"), "result.txt")
	assert.Equal(t, 1, count(t, run, `#phases tr[data-phase="`+timings.Launch+`"]`), "the phase timings of the stored record")
	run.do(t, chromedp.Navigate(hs.URL+"/ui/runs/"+sub.RunID+"/isolation"))
	assert.Positive(t, count(t, run, "#findings tbody tr"))
	assert.Empty(t, p.Fired())
}
