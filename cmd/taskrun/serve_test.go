package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workspace"
)

const (
	testWorkerToken = "cli-worker-token-0123456789"
	testUserToken   = "cli-user-token-0123456789"
	// testOtherUserToken is user bob's: another tenant than alice.
	testOtherUserToken = "cli-bob-token-0123456789"
)

// startServe runs `taskrun serve` in-process on a free loopback port with a
// SQLite database and a file store, and returns its URL and the store URL.
// Users alice and bob have tokens; extra are more serve arguments.
func startServe(t *testing.T, extra ...string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	store := "file://" + filepath.Join(dir, "store")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "w.tok"), []byte(testWorkerToken+"\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "u.tok"), []byte("alice "+testUserToken+"\nbob "+testOtherUserToken+"\n"), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	var stderr lockedbuf.Buffer
	done := make(chan int)
	go func() {
		done <- dispatch(ctx, append([]string{"serve", "--log-format", "json", "--listen", addr, "--db", "sqlite://" + filepath.Join(dir, "cp.db"),
			"--store", store, "--worker-token-file", filepath.Join(dir, "w.tok"), "--user-token-file", filepath.Join(dir, "u.tok")}, extra...), &lockedbuf.Buffer{}, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		assert.Equal(t, exitOK, <-done, "serve exits cleanly when cancelled: %s", stderr.String())
	})
	url := "http://" + addr
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "serve never became ready: %s", stderr.String())
	return url, store
}

// TestServeSubmitRunsLogs drives the control plane from the CLI: submit with
// a workspace, a worker leases the run and finds the workspace in the shared
// store, and runs and logs --server show what it reported.
func TestServeSubmitRunsLogs(t *testing.T) {
	url, storeURL := startServe(t)
	t.Setenv(envToken, testUserToken)
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "main.go"), []byte("package main\n"), 0o644))

	out, stderr, code := taskrunCmd("submit", "--server", url, "--prompt", "fix it", "--workspace", ws, "--model", "scripted", "--image", "taskrun/agent:local")
	require.Equal(t, exitOK, code, stderr)
	runID := strings.TrimSpace(out)
	require.NoError(t, model.ValidateID("run", runID))

	ctx := context.Background()
	wc := workerclient.New(url, testWorkerToken)
	a, err := wc.AcquireLease(ctx, workerclient.LeaseRequest{WorkerID: "w1", Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1},
		Labels: workerclient.WorkerLabels{Images: []string{"taskrun/agent:local"}}})
	require.NoError(t, err)
	require.NotNil(t, a)
	assert.Equal(t, runID, a.Run.ID)
	assert.Equal(t, "fix it", a.Task.Prompt)
	require.NotNil(t, a.Workspace)

	st, err := persist.Open(ctx, storeURL)
	require.NoError(t, err)
	defer st.Close()
	rc, err := st.Open(ctx, a.Workspace.Key)
	require.NoError(t, err)
	home := t.TempDir()
	_, err = workspace.UnpackHome(ctx, rc, home, workspace.UnpackOptions{})
	rc.Close()
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(home, "main.go"))
	require.NoError(t, err)
	assert.Equal(t, "package main\n", string(got), "the worker unpacks the submitted workspace")

	w := wc.Fenced(a.Lease)
	require.NoError(t, w.Stream().Send(ctx, runID, workerclient.Delta{Data: []byte("hello from the agent\n")}))
	require.NoError(t, w.Stream().End(ctx, runID, 21))
	exit := 0
	require.NoError(t, w.UpdateRunStatus(ctx, runID, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded, ExitCode: &exit}))

	out, stderr, code = taskrunCmd("runs", "--server", url)
	require.Equal(t, exitOK, code, stderr)
	assert.Regexp(t, runID+`\s+\S+\s+SUCCEEDED`, out)
	out, stderr, code = taskrunCmd("logs", "--server", url, runID, "--follow")
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "hello from the agent\n", out)

	// --wait follows a run to its end and exits non-zero when it failed.
	waited := make(chan [3]any)
	go func() {
		out, stderr, code := taskrunCmd("submit", "--server", url, "--prompt", "fail", "--wait")
		waited <- [3]any{out, stderr, code}
	}()
	b, err := wc.AcquireLease(ctx, workerclient.LeaseRequest{WorkerID: "w1", Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1}, WaitMillis: 20000})
	require.NoError(t, err)
	require.NotNil(t, b)
	wb := wc.Fenced(b.Lease)
	require.NoError(t, wb.Stream().Send(ctx, b.Run.ID, workerclient.Delta{Data: []byte("oops\n")}))
	require.NoError(t, wb.Stream().End(ctx, b.Run.ID, 5))
	msg := "the agent gave up"
	require.NoError(t, wb.UpdateRunStatus(ctx, b.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusFailed, Error: &msg}))
	res := <-waited
	assert.Equal(t, exitFailure, res[2], res[1])
	assert.Equal(t, b.Run.ID+"\noops\n", res[0])
	assert.Contains(t, res[1], "the agent gave up")
}

// TestServeRefusesBadTokens: serve does not start with a token shared by a
// worker and a user, or with no user token.
func TestServeRefusesBadTokens(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "t")
	require.NoError(t, os.WriteFile(tok, []byte("same-token-0123456789\n"), 0o600))
	db := "sqlite://" + filepath.Join(dir, "cp.db")
	_, stderr, code := taskrunCmd("serve", "--listen", "127.0.0.1:0", "--db", db, "--store", "mem://", "--worker-token-file", tok, "--user-token-file", tok)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "must differ")
	t.Setenv(envUserToken, "")
	_, stderr, code = taskrunCmd("serve", "--listen", "127.0.0.1:0", "--db", db, "--store", "mem://", "--worker-token-file", tok)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "no user token")
	_, stderr, code = taskrunCmd("serve", "--db", "mysql://x", "--store", "mem://", "--worker-token-file", tok)
	assert.NotEqual(t, exitOK, code, fmt.Sprint(stderr))
}

// submit passes the command, the environment, the egress policy and the
// limits to the worker as taskrun run takes them, and cancel stops the run
// through the control plane.
func TestSubmitPassesTheRunAndCancelStopsIt(t *testing.T) {
	url, _ := startServe(t)
	t.Setenv(envToken, testUserToken)
	t.Setenv("SUBMIT_TEST_FROM_HOST", "host value")

	out, stderr, code := taskrunCmd("submit", "--server", url, "--prompt", "p", "--image", "taskrun/agent:local",
		"--env", "GREETING=hi", "--env", "SUBMIT_TEST_FROM_HOST", "--allow", "api.example.com", "--max-tokens", "500",
		"--cpus", "0.5", "--pids", "64", "--disk", "1g", "--max-output", "1m", "--timeout", "90s",
		"--", "sh", "-c", "echo --not-a-flag")
	require.Equal(t, exitOK, code, stderr)
	runID := strings.TrimSpace(out)

	ctx := context.Background()
	wc := workerclient.New(url, testWorkerToken)
	a, err := wc.AcquireLease(ctx, workerclient.LeaseRequest{WorkerID: "w1", Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1},
		Labels: workerclient.WorkerLabels{Images: []string{"taskrun/agent:local"}}})
	require.NoError(t, err)
	require.NotNil(t, a)
	require.Equal(t, runID, a.Run.ID)
	assert.Equal(t, []string{"sh", "-c", "echo --not-a-flag"}, a.Command)
	assert.Equal(t, []string{"GREETING=hi", "SUBMIT_TEST_FROM_HOST=host value"}, a.Env)
	assert.Equal(t, workerclient.Limits{TimeoutMillis: 90_000, CPUs: 0.5, PIDs: 64, DiskBytes: 1 << 30, MaxOutputBytes: 1 << 20, MaxTokens: 500}, a.Limits)
	pol, err := egress.BuildPolicy("", []string{"api.example.com"}, nil)
	require.NoError(t, err)
	var got egress.Policy
	require.NoError(t, json.Unmarshal(a.Egress, &got))
	assert.Equal(t, pol, got)

	_, stderr, code = taskrunCmd("cancel", runID)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--server is required")
	out, stderr, code = taskrunCmd("cancel", "--server", url, runID)
	require.Equal(t, exitOK, code, stderr)
	assert.JSONEq(t, `{"run":"`+runID+`","status":"RUNNING","cancel_requested":true}`, out)
	renew, err := wc.RenewLease(ctx, a.Lease)
	require.NoError(t, err)
	assert.True(t, renew.Cancel, "the worker is told to stop the run")

	// A queued run ends at once; an ended one is refused.
	out, stderr, code = taskrunCmd("submit", "--server", url, "--prompt", "p")
	require.Equal(t, exitOK, code, stderr)
	queued := strings.TrimSpace(out)
	out, stderr, code = taskrunCmd("cancel", "--server", url, queued)
	require.Equal(t, exitOK, code, stderr)
	assert.JSONEq(t, `{"run":"`+queued+`","status":"CANCELLED"}`, out)
	_, stderr, code = taskrunCmd("cancel", "--server", url, queued)
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, stderr, "taskrun cancel:")

	_, stderr, code = taskrunCmd("submit", "--server", url, "--prompt", "p", "--env", "HOME=/root")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "HOME is set by taskrun")
	_, stderr, code = taskrunCmd("submit", "--server", url, "--prompt", "p", "--allow", "")
	assert.Equal(t, exitUsage, code, stderr)
}
