package faults

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// Tokens of the control plane the serve cases start.
const (
	workerToken = "faults-worker-token-0123456789"
	userToken   = "faults-user-token-0123456789"
)

// controlPlane is a `taskrun serve` on one address and database, which a
// case can kill and start again.
type controlPlane struct {
	e                *env
	addr, db         string
	wtok, utok, logf string
	ttl              time.Duration
	p                *proc
}

// newControlPlane starts `taskrun serve` on db and waits until it is ready.
func newControlPlane(t *testing.T, e *env, db string, ttl time.Duration) *controlPlane {
	t.Helper()
	dir := t.TempDir()
	c := &controlPlane{e: e, addr: freeAddr(t), db: db, ttl: ttl,
		wtok: filepath.Join(dir, "w.tok"), utok: filepath.Join(dir, "u.tok"), logf: filepath.Join(dir, "serve.log")}
	require.NoError(t, os.WriteFile(c.wtok, []byte(workerToken+"\n"), 0o600))
	require.NoError(t, os.WriteFile(c.utok, []byte(e.user+" "+userToken+"\n"), 0o600))
	c.start(t)
	return c
}

// url is the control plane's base URL.
func (c *controlPlane) url() string { return "http://" + c.addr }

// start starts serve and waits for /readyz.
func (c *controlPlane) start(t *testing.T) {
	t.Helper()
	c.p = start(t, c.e.command(t, "serve", "--log-format", "json", "--listen", c.addr, "--db", c.db, "--store", c.e.store,
		"--worker-token-file", c.wtok, "--user-token-file", c.utok, "--lease-ttl", c.ttl.String()))
	p := c.p
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		_, _ = waitExit(p, testdeadline.Scale(30*time.Second))
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get(c.url() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, testdeadline.Scale(time.Minute), 20*time.Millisecond, "serve never became ready: %s", &p.stderr)
}

// kill SIGKILLs serve and waits until it is gone.
func (c *controlPlane) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, c.p.cmd.Process.Signal(syscall.SIGKILL))
	_, ended := waitExit(c.p, testdeadline.Scale(30*time.Second))
	require.True(t, ended, "serve outlived SIGKILL")
}

// startWorker starts `taskrun worker` leasing from the control plane.
func (c *controlPlane) startWorker(t *testing.T, slots int) *proc {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tok, []byte(workerToken+"\n"), 0o600))
	w := start(t, c.e.command(t, "worker", "--log-format", "json",
		"--server", c.url(), "--token-file", tok, "--slots", fmt.Sprint(slots),
		"--store", c.e.store, "--root", c.e.root, "--image", testImage, "--labels", "runtime=runc,image="+testImage,
		"--helpers-dir", c.e.helpers, "--drain-grace", testdeadline.Scale(30*time.Second).String(), "--lease-wait", "2s",
		"--disk", "64m", "--max-output", "16m", "--timeout", "5m"))
	t.Cleanup(func() {
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
		_, _ = waitExit(w, testdeadline.Scale(time.Minute))
	})
	return w
}

// user is a user API client of the control plane.
func (c *controlPlane) user(t *testing.T) *client.Client {
	t.Helper()
	u, err := client.New(c.url(), userToken, nil)
	require.NoError(t, err)
	return u
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// serveDown is how long the control plane stays dead in the serve case:
// longer than the worker's renewal interval (a third of the lease), shorter
// than the lease.
const serveDown = 12 * time.Second

// `taskrun serve` on SQLite SIGKILLed mid-run and started again on the same
// address and database: the worker's stream, renewals and report wait it
// out, and the run ends SUCCEEDED once, on its first lease, with every byte
// of its output in the control plane's stream (ended) and in the store, and
// one record in the run index. It fails if the worker gave the run up while
// the control plane was away (a second lease, a FAILED "worker lost"), if
// output sent while it was down were lost or doubled, or if the run were
// indexed twice.
func TestServeKilledAndRestartedMidRunReportsOnce(t *testing.T) {
	e := newEnv(t)
	ttl := testdeadline.Scale(45 * time.Second)
	cp := newControlPlane(t, e, "sqlite://"+filepath.Join(t.TempDir(), "cp.db"), ttl)
	ctx := context.Background()
	const lines = 1000 // at least 20 s of printing
	resp, err := cp.user(t).Submit(ctx, controlplane.SubmitRequest{
		Prompt: "print", Image: testImage, Runtime: "runc",
		Command: printer(lines),
		Limits:  workerclient.Limits{MemoryBytes: 128 << 20, TimeoutMillis: 300000},
	}, nil)
	require.NoError(t, err)
	w := cp.startWorker(t, 1)

	require.Eventually(t, func() bool {
		r, err := cp.user(t).GetRun(ctx, resp.RunID)
		return err == nil && r.StreamNext > 100
	}, testdeadline.Scale(2*time.Minute), 20*time.Millisecond, "the run never streamed: %s", &w.stderr)
	cp.kill(t)
	time.Sleep(serveDown) // the fault itself: the control plane is away this long
	cp.start(t)

	wctx, cancel := context.WithTimeout(ctx, testdeadline.Scale(3*time.Minute))
	defer cancel()
	r, err := cp.user(t).Wait(wctx, resp.RunID, 100*time.Millisecond)
	require.NoError(t, err, "the run did not end: %s", &w.stderr)
	assert.Equal(t, model.StatusSucceeded, r.Status, "reason: %s", r.Error)
	assert.Equal(t, 1, r.Attempts, "the run was leased again")
	assert.Equal(t, int64(1), r.Epoch)
	assert.True(t, r.StreamEnded, "the output stream was not ended")

	rc, err := cp.user(t).Output(ctx, resp.RunID, 0, false)
	require.NoError(t, err)
	streamed, err := io.ReadAll(rc)
	rc.Close()
	require.NoError(t, err)
	require.Equal(t, lines, requireNumberedLines(t, string(streamed)), "the control plane's stream lacks lines")
	// One record: the control plane holds the worker's runs (they are
	// not in the store's run index).
	runs, err := cp.user(t).ListRuns(ctx, "", 100)
	require.NoError(t, err)
	require.Len(t, runs, 1, "the control plane holds one run")
	stored := e.outputLogOf(t, r.Task.ConversationID, r.Task.ID, resp.RunID)
	assert.Equal(t, string(streamed), stored, "the store's output.log is not the streamed output")
}
