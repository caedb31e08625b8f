package server_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/controlplane/sqlite"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/internal/pgtest"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/workerclient"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const (
	workerToken = "worker-token-0123456789"
	// otherWorkerToken is a second worker's credential.
	otherWorkerToken = "worker-token-other-0123456789"
	userToken        = "user-token-alice-0123456789"
	bobToken         = "user-token-bob-0123456789"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type env struct {
	url    string
	srv    *server.Server
	store  controlplane.Store
	blobs  *persist.Store
	clock  *clock
	worker *workerclient.Client
	user   *client.Client
	bob    *client.Client
}

func tokens(t testing.TB) *server.Tokens {
	var tk server.Tokens
	require.NoError(t, tk.AddWorker("worker-a", workerToken))
	require.NoError(t, tk.AddWorker("worker-b", otherWorkerToken))
	require.NoError(t, tk.AddUser("alice", userToken))
	require.NoError(t, tk.AddUser("bob", bobToken))
	return &tk
}

func newEnv(t testing.TB, store controlplane.Store, mod func(*server.Config)) *env {
	t.Helper()
	ctx := context.Background()
	if store == nil {
		s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "cp.db"))
		require.NoError(t, err)
		store = s
		t.Cleanup(func() { s.Close() })
	}
	blobs, err := persist.Open(ctx, "mem://")
	require.NoError(t, err)
	t.Cleanup(func() { blobs.Close() })
	clk := &clock{t: time.UnixMilli(1767225600000)}
	cfg := server.Config{Store: store, Blobs: blobs, Tokens: tokens(t), Now: clk.Now, LeaseTTL: 15 * time.Second,
		PollInterval: 20 * time.Millisecond, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := server.New(cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	e := &env{url: hs.URL, srv: srv, store: store, blobs: blobs, clock: clk,
		worker: workerclient.New(hs.URL, workerToken, workerclient.WithRetryPolicy(workerclient.RetryPolicy{MaxAttempts: 1}))}
	e.user, err = client.New(hs.URL, userToken, nil)
	require.NoError(t, err)
	e.bob, err = client.New(hs.URL, bobToken, nil)
	require.NoError(t, err)
	return e
}

var labels = workerclient.WorkerLabels{Runtimes: []string{"runc"}, Images: []string{"taskrun/agent:local"}}

func (e *env) lease(t *testing.T, wait time.Duration) *workerclient.Assignment {
	t.Helper()
	a, err := e.worker.AcquireLease(context.Background(), workerclient.LeaseRequest{WorkerID: "host-a/1",
		Capacity: workerclient.Capacity{Slots: 2, FreeSlots: 2}, Labels: labels, WaitMillis: wait.Milliseconds()})
	require.NoError(t, err)
	return a
}

func tarGz(t *testing.T, files map[string]string) []byte {
	var b bytes.Buffer
	gz := gzip.NewWriter(&b)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	return b.Bytes()
}

// TestRunLifecycle: a user submits a task with a workspace; a worker leases
// it, reads the workspace from the shared store, streams output while the
// user follows it, and reports success; the user reads the run back.
func TestRunLifecycle(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	ws := tarGz(t, map[string]string{"README.md": "hello"})
	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "fix it", Model: "scripted", Image: "taskrun/agent:local",
		Runtime: "runc", Limits: workerclient.Limits{MemoryBytes: 1 << 30}}, bytes.NewReader(ws))
	require.NoError(t, err)
	assert.Equal(t, "QUEUED", sub.Status)

	a := e.lease(t, 0)
	require.NotNil(t, a)
	assert.Equal(t, sub.RunID, a.Lease.RunID)
	assert.Equal(t, int64(1), a.Lease.Epoch)
	assert.Equal(t, int64(15000), a.Lease.TTLMillis)
	assert.Equal(t, int64(5000), a.Lease.RenewMillis)
	assert.Equal(t, "fix it", a.Task.Prompt)
	assert.Equal(t, "alice", a.Task.UserID)
	assert.Equal(t, "scripted", a.Model)
	require.NotNil(t, a.Workspace)
	rc, err := e.blobs.Open(ctx, a.Workspace.Key)
	require.NoError(t, err, "the worker can read the workspace at the key it was given")
	got, _ := io.ReadAll(rc)
	rc.Close()
	sum := sha256.Sum256(ws)
	assert.Equal(t, ws, got)
	assert.Equal(t, hex.EncodeToString(sum[:]), a.Workspace.SHA256)
	assert.Equal(t, int64(len(ws)), a.Workspace.Size)

	w := e.worker.Fenced(a.Lease)
	start := e.clock.Now().UnixMilli()
	require.NoError(t, w.UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusRunning, StartedAt: &start,
		Container: &workerclient.ContainerInfo{ID: "c1", ImageDigest: "sha256:abc", Runtime: "runc"}}))

	follow, err := e.user.Output(ctx, a.Run.ID, 0, true)
	require.NoError(t, err)
	followed := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(follow)
		follow.Close()
		followed <- b
	}()
	st := w.Stream()
	require.NoError(t, st.Send(ctx, a.Run.ID, workerclient.Delta{Offset: 0, Data: []byte("line 1\n")}))
	require.NoError(t, st.Send(ctx, a.Run.ID, workerclient.Delta{Offset: 0, Data: []byte("line 1\nline 2\n")}), "a resend with more bytes")
	require.NoError(t, st.End(ctx, a.Run.ID, 14))
	assert.Equal(t, "line 1\nline 2\n", string(<-followed), "the follower got every byte once and its answer ended with the stream")

	rn, err := e.worker.RenewLease(ctx, a.Lease)
	require.NoError(t, err)
	assert.False(t, rn.Cancel)
	out, exit, pt, ct := "done", 0, 100, 20
	require.NoError(t, w.UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded, Output: &out,
		ExitCode: &exit, PromptTokens: &pt, CompletionTokens: &ct, Changes: &workerclient.ChangeSet{Files: 1, Modified: 1}}))

	run, err := e.user.GetRun(ctx, a.Run.ID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, run.Status)
	assert.Equal(t, "sha256:abc", run.Container.ImageDigest)
	assert.Equal(t, int64(100), run.PromptTokens)
	assert.Equal(t, 1, run.Changes.Modified)
	assert.Equal(t, "host-a/1", run.WorkerID)
	runs, err := e.user.ListRuns(ctx, model.StatusSucceeded, 10)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Empty(t, runs[0].Task.Prompt, "lists leave the prompt and output out")

	rc2, err := e.user.Output(ctx, a.Run.ID, 7, false)
	require.NoError(t, err)
	tail, _ := io.ReadAll(rc2)
	rc2.Close()
	assert.Equal(t, "line 2\n", string(tail))
}

// TestStaleFenceRefused: once the sweeper expired a lease, the old holder's
// PATCH, stream and renew are refused with 412 (ErrLeaseLost); a retryable
// run is requeued and leased again with a higher epoch.
func TestStaleFenceRefused(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	_, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p", Retryable: true}, nil)
	require.NoError(t, err)
	a := e.lease(t, 0)
	require.NotNil(t, a)
	old := e.worker.Fenced(a.Lease)

	e.clock.Add(16 * time.Second)
	ex, err := e.srv.SweepOnce(ctx)
	require.NoError(t, err)
	require.Len(t, ex, 1)
	assert.True(t, ex[0].Requeued)

	b := e.lease(t, 0)
	require.NotNil(t, b)
	assert.Equal(t, a.Run.ID, b.Run.ID)
	assert.Equal(t, int64(2), b.Lease.Epoch, "requeued with a higher epoch")

	err = old.UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusRunning})
	assert.ErrorIs(t, err, workerclient.ErrLeaseLost)
	assertStatus(t, err, http.StatusPreconditionFailed)
	err = old.Stream().Send(ctx, a.Run.ID, workerclient.Delta{Data: []byte("x")})
	assert.ErrorIs(t, err, workerclient.ErrLeaseLost)
	_, err = e.worker.RenewLease(ctx, a.Lease)
	assert.ErrorIs(t, err, workerclient.ErrLeaseLost)

	_, err = e.worker.RenewLease(ctx, b.Lease)
	require.NoError(t, err, "the new holder is fine")
	require.NoError(t, e.worker.Fenced(b.Lease).UpdateRunStatus(ctx, b.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusRunning}))

	// Without the fence header at all: 428, not silently accepted.
	req, _ := http.NewRequest(http.MethodPatch, e.url+"/v1/task-runs/"+b.Run.ID, strings.NewReader(`{"status":"FAILED"}`))
	req.Header.Set("Authorization", "Bearer "+workerToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusPreconditionRequired, resp.StatusCode)
}

// TestForgedPatchByAnotherWorkerRefused: the run's epoch is no longer
// enough. Another worker's credential, with the epoch and a guessed token
// or even the lease's own token, is refused 403 on PATCH, stream and renew,
// and the run is unchanged; without the token the call is refused 428.
func TestForgedPatchByAnotherWorkerRefused(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	_, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	a := e.lease(t, 0)
	require.NotNil(t, a)
	assert.GreaterOrEqual(t, len(a.Lease.Token), 22, "at least 128 random bits")

	other := workerclient.New(e.url, otherWorkerToken, workerclient.WithRetryPolicy(workerclient.RetryPolicy{MaxAttempts: 1}))
	forged := "forged output"
	done := &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded, Output: &forged}
	guessed := a.Lease
	guessed.Token = "guessed-token-0123456789abcdefghijk"
	for name, c := range map[string]*workerclient.Client{
		"another worker, the epoch and a guessed token": other.Fenced(guessed),
		"another worker with the lease's own token":     other.Fenced(a.Lease),
		"the holder's credential, a guessed token":      e.worker.Fenced(guessed),
	} {
		err := c.UpdateRunStatus(ctx, a.Run.ID, done)
		assertStatus(t, err, http.StatusForbidden)
		assert.ErrorIs(t, err, workerclient.ErrNotHolder, name)
		assert.NotErrorIs(t, err, workerclient.ErrLeaseLost, name)
		err = c.Stream().Send(ctx, a.Run.ID, workerclient.Delta{Data: []byte("forged")})
		assertStatus(t, err, http.StatusForbidden)
		_, err = other.RenewLease(ctx, a.Lease)
		assertStatus(t, err, http.StatusForbidden)
	}
	run, err := e.user.GetRun(ctx, a.Run.ID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusRunning, run.Status, "no forged call changed the run")
	assert.Empty(t, run.Output)
	assert.Zero(t, run.StreamNext)

	// The lease token is required, not optional.
	req, _ := http.NewRequest(http.MethodPatch, e.url+"/v1/task-runs/"+a.Run.ID, strings.NewReader(`{"status":"SUCCEEDED"}`))
	req.Header.Set("Authorization", "Bearer "+otherWorkerToken)
	req.Header.Set(workerclient.HeaderFence, strconv.FormatInt(a.Lease.Epoch, 10))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusPreconditionRequired, resp.StatusCode)

	// The holder itself is fine.
	require.NoError(t, e.worker.Fenced(a.Lease).UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded}))
}

func assertStatus(t *testing.T, err error, code int) {
	t.Helper()
	var he *workerclient.HTTPError
	if assert.ErrorAs(t, err, &he) {
		assert.Equal(t, code, he.StatusCode)
	}
}

// TestExpiredLeaseWorkerLost: a non-retryable run whose worker stops renewing
// is finalized FAILED "worker lost" and never leased again.
func TestExpiredLeaseWorkerLost(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	a := e.lease(t, 0)
	require.NotNil(t, a)
	e.clock.Add(10 * time.Second)
	_, err = e.worker.RenewLease(ctx, a.Lease)
	require.NoError(t, err)
	e.clock.Add(10 * time.Second)
	ex, err := e.srv.SweepOnce(ctx)
	require.NoError(t, err)
	assert.Empty(t, ex, "renewed: 10 s into a 15 s lease")
	e.clock.Add(6 * time.Second)
	ex, err = e.srv.SweepOnce(ctx)
	require.NoError(t, err)
	require.Len(t, ex, 1)

	run, err := e.user.GetRun(ctx, sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusFailed, run.Status)
	assert.Equal(t, "worker lost", run.Error)
	assert.Nil(t, e.lease(t, 0), "a lost run without retryable is not executed again")
}

// TestCancel: cancelling a leased run reaches its worker at the next renewal.
func TestCancel(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	a := e.lease(t, 0)
	require.NotNil(t, a)
	_, err = e.bob.Cancel(ctx, sub.RunID)
	assert.ErrorIs(t, err, client.ErrNotFound, "another user cannot cancel it")
	run, err := e.user.Cancel(ctx, sub.RunID)
	require.NoError(t, err)
	assert.True(t, run.CancelRequested)
	rn, err := e.worker.RenewLease(ctx, a.Lease)
	require.NoError(t, err)
	assert.True(t, rn.Cancel)
	require.NoError(t, e.worker.Fenced(a.Lease).UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusCancelled}))
	_, err = e.user.Cancel(ctx, sub.RunID)
	var he *client.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusConflict, he.StatusCode)
}

// TestLongPollWakesOnSubmit: a lease call waiting on an empty queue gets the
// run submitted meanwhile.
func TestLongPollWakesOnSubmit(t *testing.T) {
	e := newEnv(t, nil, nil)
	got := make(chan *workerclient.Assignment, 1)
	go func() {
		a, _ := e.worker.AcquireLease(context.Background(), workerclient.LeaseRequest{WorkerID: "w",
			Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1}, Labels: labels, WaitMillis: 20000})
		got <- a
	}()
	sub, err := e.user.Submit(context.Background(), controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	a := <-got
	require.NotNil(t, a)
	assert.Equal(t, sub.RunID, a.Run.ID)
}

// TestLeaseFits: runs are only handed to workers that can take them.
func TestLeaseFits(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	for _, r := range []controlplane.SubmitRequest{
		{Prompt: "gvisor", Runtime: "runsc"},
		{Prompt: "other image", Image: "elsewhere/agent:1"},
		{Prompt: "big", Limits: workerclient.Limits{MemoryBytes: 8 << 30}},
		{Prompt: "fits", Image: "taskrun/agent:local"},
	} {
		_, err := e.user.Submit(ctx, r, nil)
		require.NoError(t, err)
	}
	a, err := e.worker.AcquireLease(ctx, workerclient.LeaseRequest{WorkerID: "w", Labels: labels,
		Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1, FreeMemoryBytes: 2 << 30}})
	require.NoError(t, err)
	require.NotNil(t, a)
	assert.Equal(t, "fits", a.Task.Prompt)
	a, err = e.worker.AcquireLease(ctx, workerclient.LeaseRequest{WorkerID: "w", Labels: labels,
		Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 0}})
	require.NoError(t, err)
	assert.Nil(t, a, "no free slot, no run")
}

func do(t *testing.T, method, url, token, contentType string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAuthSeparation: worker and user tokens open only their own API, a
// missing or unknown token opens nothing, a user sees only their own runs.
func TestAuthSeparation(t *testing.T) {
	e := newEnv(t, nil, nil)
	sub, err := e.user.Submit(context.Background(), controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	lease := `{"worker_id":"w","capacity":{"slots":1,"free_slots":1}}`
	for _, c := range []struct {
		name, method, path, token, body string
		want                            int
	}{
		{"user token on lease", "POST", "/v1/leases", userToken, lease, http.StatusForbidden},
		{"user token on renew", "POST", "/v1/leases/" + sub.RunID + "/renew", userToken, "", http.StatusForbidden},
		{"user token on patch", "PATCH", "/v1/task-runs/" + sub.RunID, userToken, `{"status":"FAILED"}`, http.StatusForbidden},
		{"user token on stream", "POST", "/v1/task-runs/" + sub.RunID + "/stream", userToken, "x", http.StatusForbidden},
		{"worker token on submit", "POST", "/v1/tasks", workerToken, `{"prompt":"p"}`, http.StatusForbidden},
		{"worker token on list", "GET", "/v1/runs", workerToken, "", http.StatusForbidden},
		{"worker token on output", "GET", "/v1/runs/" + sub.RunID + "/output", workerToken, "", http.StatusForbidden},
		{"no token", "POST", "/v1/leases", "", lease, http.StatusUnauthorized},
		{"unknown token", "GET", "/v1/runs", "user-token-alice-012345678X", "", http.StatusUnauthorized},
		{"other user's run", "GET", "/v1/runs/" + sub.RunID, bobToken, "", http.StatusNotFound},
		{"other user's output", "GET", "/v1/runs/" + sub.RunID + "/output", bobToken, "", http.StatusNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _ := do(t, c.method, e.url+c.path, c.token, "application/json", strings.NewReader(c.body))
			assert.Equal(t, c.want, code)
		})
	}
	runs, err := e.bob.ListRuns(context.Background(), "", 0)
	require.NoError(t, err)
	assert.Empty(t, runs, "bob does not see alice's runs")
	run, err := e.store.GetRun(context.Background(), sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusQueued, run.Status, "nothing a refused request sent was applied")
}

// TestTokensCheck: a token that is both a worker's and a user's is refused.
func TestTokensCheck(t *testing.T) {
	var tk server.Tokens
	require.NoError(t, tk.ReadWorkerTokens(strings.NewReader("# workers\nsame-token-0123456789\n")))
	require.NoError(t, tk.ReadUserTokens(strings.NewReader("alice same-token-0123456789\n")))
	assert.Error(t, tk.Check())
	assert.Error(t, tk.AddWorker("w", "short"))
	var ok server.Tokens
	require.NoError(t, ok.ReadWorkerTokens(strings.NewReader("w-token-0123456789abc\n")))
	require.NoError(t, ok.ReadUserTokens(strings.NewReader("u-token-0123456789abc\n")))
	require.NoError(t, ok.Check())
}

// TestUserAPIBounds: what a client sends is bounded.
func TestUserAPIBounds(t *testing.T) {
	e := newEnv(t, nil, func(c *server.Config) {
		c.Limits = server.Limits{MaxPromptBytes: 1000, MaxTaskBytes: 4000, MaxWorkspaceBytes: 2000, MaxFollowersPerRun: 2, MaxQueuedPerUser: 2}
	})
	ctx := context.Background()
	_, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: strings.Repeat("a", 1001)}, nil)
	assertClientStatus(t, err, http.StatusBadRequest)
	code, _ := do(t, "POST", e.url+"/v1/tasks", userToken, "application/json", strings.NewReader(`{"prompt":"`+strings.Repeat("a", 5000)+`"}`))
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
	_, err = e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, bytes.NewReader(make([]byte, 5000)))
	assertClientStatus(t, err, http.StatusRequestEntityTooLarge)
	_, err = e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: " "}, nil)
	assertClientStatus(t, err, http.StatusBadRequest)
	_, err = e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p", ConversationID: "../x"}, nil)
	assertClientStatus(t, err, http.StatusBadRequest)
	_, err = e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p", Limits: workerclient.Limits{MemoryBytes: -1}}, nil)
	assertClientStatus(t, err, http.StatusBadRequest)
	_, err = e.user.ListRuns(ctx, "", 100000)
	assertClientStatus(t, err, http.StatusBadRequest)
	_, err = e.user.ListRuns(ctx, "BOGUS", 0)
	assertClientStatus(t, err, http.StatusBadRequest)
	runs, err := e.user.ListRuns(ctx, "", 0)
	require.NoError(t, err)
	assert.Empty(t, runs, "no refused submission created a run")

	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range 2 {
		rc, err := e.user.Output(fctx, sub.RunID, 0, true)
		require.NoError(t, err)
		defer rc.Close()
	}
	_, err = e.user.Output(ctx, sub.RunID, 0, true)
	assertClientStatus(t, err, http.StatusTooManyRequests)
	_, err = e.user.Output(ctx, sub.RunID, -1, false)
	assertClientStatus(t, err, http.StatusBadRequest)

	// A user's queue is bounded; another user's is their own.
	e.clock.Add(time.Second) // runs are leased oldest first: sub, then p2, then bob's
	_, err = e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p2"}, nil)
	require.NoError(t, err)
	_, err = e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p3"}, nil)
	assertClientStatus(t, err, http.StatusTooManyRequests)
	e.clock.Add(time.Second)
	_, err = e.bob.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	got := e.lease(t, 0)
	require.NotNil(t, got)
	require.Equal(t, sub.RunID, got.Run.ID)
	_, err = e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p3"}, nil)
	require.NoError(t, err, "room again once a run left the queue")
}

func assertClientStatus(t *testing.T, err error, code int) {
	t.Helper()
	var he *client.HTTPError
	if assert.ErrorAs(t, err, &he) {
		assert.Equal(t, code, he.StatusCode, he.Message)
	}
}

// TestOutputCap: the output the server holds per run is capped (413).
func TestOutputCap(t *testing.T) {
	e := newEnv(t, nil, func(c *server.Config) { c.Limits.MaxOutputBytes = 100 })
	ctx := context.Background()
	_, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	a := e.lease(t, 0)
	require.NotNil(t, a)
	st := e.worker.Fenced(a.Lease).Stream()
	require.NoError(t, st.Send(ctx, a.Run.ID, workerclient.Delta{Data: make([]byte, 100)}))
	err = st.Send(ctx, a.Run.ID, workerclient.Delta{Offset: 100, Data: []byte("x")})
	assertStatus(t, err, http.StatusRequestEntityTooLarge)
}

// TestMetrics scrapes /metrics and parses it with Prometheus' text parser.
func TestMetrics(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	_, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p1"}, nil)
	require.NoError(t, err)
	_, err = e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p2"}, nil)
	require.NoError(t, err)
	a := e.lease(t, 0)
	require.NotNil(t, a)
	w := e.worker.Fenced(a.Lease)
	require.NoError(t, w.Stream().Send(ctx, a.Run.ID, workerclient.Delta{Data: []byte("12345")}))
	_, err = e.worker.RenewLease(ctx, a.Lease)
	require.NoError(t, err)
	pt, ct := 7, 3
	require.NoError(t, w.UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded, PromptTokens: &pt, CompletionTokens: &ct}))
	b := e.lease(t, 0)
	require.NotNil(t, b)
	e.clock.Add(time.Minute)
	_, err = e.srv.SweepOnce(ctx)
	require.NoError(t, err)
	err = e.worker.Fenced(b.Lease).UpdateRunStatus(ctx, b.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusRunning})
	require.ErrorIs(t, err, workerclient.ErrLeaseLost)
	rc, err := e.user.Output(ctx, a.Run.ID, 0, false)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, rc)
	rc.Close()

	code, body := do(t, "GET", e.url+"/metrics", "", "", nil)
	require.Equal(t, http.StatusOK, code)
	p := expfmt.NewTextParser(prommodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)
	value := func(name string, lbl ...string) float64 {
		t.Helper()
		f := fams[name]
		require.NotNil(t, f, name)
	next:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(lbl); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == lbl[i] && lp.GetValue() == lbl[i+1])
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
		t.Fatalf("no series %s%v", name, lbl)
		return 0
	}
	assert.Equal(t, 1.0, value("taskrun_runs", "status", "SUCCEEDED"))
	assert.Equal(t, 1.0, value("taskrun_runs", "status", "FAILED"))
	assert.Equal(t, 0.0, value("taskrun_runs", "status", "QUEUED"))
	assert.Equal(t, 2.0, value("taskrun_leases_granted_total"))
	assert.Equal(t, 2.0, value("taskrun_queue_wait_seconds"), "one observation per lease")
	assert.Equal(t, 1.0, value("taskrun_lease_renewals_total"))
	assert.Equal(t, 1.0, value("taskrun_lease_expiries_total", "outcome", "failed"))
	assert.Equal(t, 1.0, value("taskrun_stale_fence_refusals_total", "endpoint", "patch"))
	assert.Equal(t, 5.0, value("taskrun_output_bytes_received_total"))
	assert.Equal(t, 5.0, value("taskrun_output_bytes_streamed_total"))
	assert.Equal(t, 7.0, value("taskrun_tokens_metered_total", "kind", "prompt"))
	assert.Equal(t, 3.0, value("taskrun_tokens_metered_total", "kind", "completion"))
	assert.Equal(t, 2.0, value("taskrun_tasks_submitted_total"))

	code, _ = do(t, "GET", e.url+"/healthz", "", "", nil)
	assert.Equal(t, http.StatusOK, code)
	code, _ = do(t, "GET", e.url+"/readyz", "", "", nil)
	assert.Equal(t, http.StatusOK, code)
	require.NoError(t, e.store.Close())
	code, _ = do(t, "GET", e.url+"/readyz", "", "", nil)
	assert.Equal(t, http.StatusServiceUnavailable, code, "a closed database is not ready")
}

// TestUIMount: a UI handler is served under /ui/ to users only.
func TestUIMount(t *testing.T) {
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, _ := server.UserFromContext(r.Context())
		fmt.Fprint(w, "ui for ", u)
	})
	e := newEnv(t, nil, func(c *server.Config) { c.UI = ui })
	code, body := do(t, "GET", e.url+"/ui/", userToken, "", nil)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ui for alice", body)
	code, _ = do(t, "GET", e.url+"/ui/", "", "", nil)
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = do(t, "GET", e.url+"/ui/", workerToken, "", nil)
	assert.Equal(t, http.StatusForbidden, code)
}

// TestStreamHTTPAnswers: the stream endpoint answers the offset rules with
// their statuses and always says where the server is (X-Taskrun-Next).
func TestStreamHTTPAnswers(t *testing.T) {
	e := newEnv(t, nil, nil)
	_, err := e.user.Submit(context.Background(), controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	a := e.lease(t, 0)
	require.NotNil(t, a)
	post := func(off string, body string, hdr ...string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, e.url+"/v1/task-runs/"+a.Run.ID+"/stream", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+workerToken)
		req.Header.Set(workerclient.HeaderFence, fmt.Sprint(a.Lease.Epoch))
		req.Header.Set(workerclient.HeaderLeaseToken, a.Lease.Token)
		if off != "" {
			req.Header.Set(workerclient.HeaderOffset, off)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get(workerclient.HeaderNext)
	}
	code, next := post("0", "abc")
	assert.Equal(t, http.StatusNoContent, code)
	assert.Equal(t, "3", next)
	code, next = post("5", "x")
	assert.Equal(t, http.StatusConflict, code, "gap")
	assert.Equal(t, "3", next)
	code, _ = post("1", "Zc")
	assert.Equal(t, http.StatusConflict, code, "overlap with different bytes")
	code, _ = post("-1", "x")
	assert.Equal(t, http.StatusBadRequest, code)
	code, _ = post("", "", workerclient.HeaderEnd, "true", workerclient.HeaderTotal, "2")
	assert.Equal(t, http.StatusConflict, code, "wrong total")
	code, next = post("", "", workerclient.HeaderEnd, "true", workerclient.HeaderTotal, "3")
	assert.Equal(t, http.StatusNoContent, code)
	assert.Equal(t, "3", next)
	code, _ = post("3", "more")
	assert.Equal(t, http.StatusConflict, code, "past the end")
	code, _ = post("0", string(make([]byte, workerclient.MaxPostBytes+1)))
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
}

// leaseAfterClientGone is a store whose Lease, once it took a run, waits for
// the asking request to end: the worker stopped waiting (to drain) just as
// its long poll was answered.
type leaseAfterClientGone struct {
	controlplane.Store
	leased chan struct{}
}

func (s *leaseAfterClientGone) Lease(ctx context.Context, o controlplane.LeaseOffer) (*controlplane.Run, error) {
	run, err := s.Store.Lease(ctx, o)
	if run != nil {
		close(s.leased)
		<-ctx.Done()
	}
	return run, err
}

// TestUndeliveredLeaseIsReturned: a lease taken for a long poll whose client
// has gone goes back to the queue (not counted as an attempt, its epoch
// fenced) instead of expiring into "worker lost".
func TestUndeliveredLeaseIsReturned(t *testing.T) {
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "cp.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	store := &leaseAfterClientGone{Store: s, leased: make(chan struct{})}
	e := newEnv(t, store, nil)
	sub, err := e.user.Submit(context.Background(), controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)

	pollCtx, stopPolling := context.WithCancel(context.Background())
	polled := make(chan error, 1)
	go func() {
		_, err := e.worker.AcquireLease(pollCtx, workerclient.LeaseRequest{WorkerID: "draining",
			Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1}, Labels: labels, WaitMillis: 20000})
		polled <- err
	}()
	<-store.leased
	stopPolling()
	require.ErrorIs(t, <-polled, context.Canceled)

	require.Eventually(t, func() bool {
		r, err := e.store.GetRun(context.Background(), sub.RunID)
		return err == nil && r.Status == model.StatusQueued
	}, 10*time.Second, 10*time.Millisecond, "the undelivered lease is put back")
	r, err := e.store.GetRun(context.Background(), sub.RunID)
	require.NoError(t, err)
	assert.Zero(t, r.Attempts, "no attempt was made")
	_, err = e.store.Renew(context.Background(), sub.RunID, controlplane.Fence{Epoch: 1}, e.clock.Now(), time.Minute)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence, "the undelivered epoch is fenced")

	e.clock.Add(time.Hour)
	ex, err := e.store.ExpireLeases(context.Background(), e.clock.Now())
	require.NoError(t, err)
	assert.Empty(t, ex, "nothing expires into worker lost")

	a, err := s.Lease(context.Background(), controlplane.LeaseOffer{WorkerID: "other", Holder: "other", TokenHash: [32]byte{1}, Now: e.clock.Now(), TTL: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, a, "another worker gets the run")
	assert.Equal(t, int64(2), a.Epoch)
	assert.Equal(t, 1, a.Attempts)
}

// TestWorkersList: every lease request is a worker's heartbeat, which users
// read on GET /v1/workers.
func TestWorkersList(t *testing.T) {
	e := newEnv(t, nil, nil)
	ws, err := e.user.Workers(context.Background())
	require.NoError(t, err)
	assert.Empty(t, ws)

	assert.Nil(t, e.lease(t, 0), "nothing queued")
	seen := e.clock.Now()
	e.clock.Add(time.Minute)
	_, err = e.worker.AcquireLease(context.Background(), workerclient.LeaseRequest{WorkerID: "host-b/2",
		Capacity: workerclient.Capacity{Slots: 3, FreeSlots: 0, FreeMemoryBytes: 1 << 30, FreeDiskBytes: 2 << 30},
		Labels:   workerclient.WorkerLabels{Runtimes: []string{"runsc"}, CanPull: true, Backend: "kubernetes"}})
	require.NoError(t, err)

	ws, err = e.bob.Workers(context.Background())
	require.NoError(t, err)
	require.Len(t, ws, 2)
	assert.Equal(t, "host-b/2", ws[0].ID, "most recently seen first; a full worker still reports")
	assert.Equal(t, workerclient.Capacity{Slots: 3, FreeSlots: 0, FreeMemoryBytes: 1 << 30, FreeDiskBytes: 2 << 30}, ws[0].Capacity)
	assert.Equal(t, []string{"runsc"}, ws[0].Labels.Runtimes)
	assert.Equal(t, "host-a/1", ws[1].ID)
	assert.Equal(t, 2, ws[1].Capacity.FreeSlots)
	assert.Equal(t, labels, ws[1].Labels)
	assert.True(t, seen.Equal(ws[1].LastSeen), "%s != %s", seen, ws[1].LastSeen)

	e.clock.Add(controlplane.WorkerListWindow)
	ws, err = e.user.Workers(context.Background())
	require.NoError(t, err)
	require.Len(t, ws, 1, "a worker silent for longer than the window is gone")
	assert.Equal(t, "host-b/2", ws[0].ID)

	req, err := http.NewRequest(http.MethodGet, e.url+"/v1/workers", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+workerToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.NotEqual(t, http.StatusOK, resp.StatusCode, "a worker token reads no user API")
}

// TestSubmissionIsATenantsRequest: limits over the maxima, a credential
// source of the host and a rule for a special address are refused (400)
// and queue nothing; the credential refusal says the same whatever it named.
func TestSubmissionIsATenantsRequest(t *testing.T) {
	e := newEnv(t, nil, func(c *server.Config) { c.RunMaxima = runlimits.Maxima{PIDs: 1024} })
	ctx := context.Background()
	refused := func(req controlplane.SubmitRequest) string {
		t.Helper()
		req.Prompt = "p"
		_, err := e.user.Submit(ctx, req, nil)
		var he *client.HTTPError
		require.ErrorAs(t, err, &he)
		require.Equal(t, http.StatusBadRequest, he.StatusCode, he.Message)
		return he.Message
	}
	msg := refused(controlplane.SubmitRequest{Limits: workerclient.Limits{PIDs: 100000}})
	assert.Contains(t, msg, "limits.pids 100000 is over the maximum 1024")
	assert.Contains(t, msg, "--max-run-pids")
	assert.Contains(t, refused(controlplane.SubmitRequest{Limits: workerclient.Limits{MemoryBytes: 1 << 40}}), "--max-run-memory", "zero maxima are the defaults")

	file := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(file, []byte("x\n"), 0o600))
	var msgs []string
	for _, src := range []string{`"value_env":"HOME"`, `"value_env":"NOPE_NOT_SET"`, `"value_file":"` + file + `"`, `"value_file":"/nope"`} {
		msgs = append(msgs, refused(controlplane.SubmitRequest{Egress: json.RawMessage(
			`{"rules":[{"host":"a.example"}],"credentials":[{"host":"a.example","header":"X",` + src + `}]}`)}))
	}
	for _, m := range msgs {
		assert.Equal(t, msgs[0], m)
	}
	assert.Contains(t, msgs[0], egress.ErrHostSecretNamed.Error())

	assert.Contains(t, refused(controlplane.SubmitRequest{Egress: json.RawMessage(`{"rules":[{"host":"127.0.0.1","port":9000}]}`)}),
		egress.ErrSpecialAddress.Error())

	runs, err := e.user.ListRuns(ctx, "", 0)
	require.NoError(t, err)
	assert.Empty(t, runs, "no refused submission created a run")
	_, err = e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p", Limits: workerclient.Limits{PIDs: 1024},
		Egress: json.RawMessage(`{"rules":[{"host":"api.github.com"}],"credentials":[{"id":"github"}]}`)}, nil)
	require.NoError(t, err, "a request within the maxima, naming a credential by id")
}
