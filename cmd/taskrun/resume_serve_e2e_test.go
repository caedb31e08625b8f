package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
)

// A keep-alive run on runc, paused by its worker when idle (a files-only
// checkpoint: its home is kept), is resumed through `taskrun serve`: a
// second resume is refused (409), another tenant is told no such run, and
// the worker that leases it again restores it from its checkpoint: its
// command starts again in the kept home, finds what the first start left
// there, and the run ends SUCCEEDED, its output going on after what it
// streamed before the pause.
func TestResumeAPausedRunThroughServe(t *testing.T) {
	env := newCrashEnv(t)
	serve := startServeProcsWith(t, env, serveCreds{users: map[string]string{"mallory": "mallory-token-0123456789abcdef"}},
		"sqlite://"+filepath.Join(t.TempDir(), "cp.db"), 1, fleetLeaseTTL())[0]
	c, err := client.New(serve.url, fleetUserToken, nil)
	require.NoError(t, err)
	other, err := client.New(serve.url, "mallory-token-0123456789abcdef", nil)
	require.NoError(t, err)
	ctx := context.Background()
	sub, err := c.Submit(ctx, controlplane.SubmitRequest{Prompt: "pause me", Image: testImage, Runtime: "runc",
		KeepAlive: true, IdleTimeoutMillis: 2000,
		Command: []string{"sh", "-c", `cd "$HOME" && if [ -f mark ]; then echo "resumed after $(cat mark)"; exit 0; fi; echo first > mark; echo first; exec sleep 600`}}, nil)
	require.NoError(t, err)
	id := sub.RunID

	newWorkerFleet(t, env, serve.url).startOn(serve.url, "", 1, "--live-listen", freeAddr(t), "--pause-on-idle")
	paused := awaitRun(t, c, id, testdeadline.Scale(2*time.Minute), func(r controlplane.Run) bool {
		return r.Status == model.StatusPaused || r.Status.Terminal()
	}, "never paused")
	require.Equal(t, model.StatusPaused, paused.Status, paused.Error)

	_, err = other.Resume(ctx, id)
	require.ErrorIs(t, err, client.ErrNotFound, "another tenant's run is not found")
	r, err := c.Resume(ctx, id)
	require.NoError(t, err)
	assert.True(t, r.Resume)
	_, err = c.Resume(ctx, id)
	var he *client.HTTPError
	if assert.True(t, errors.As(err, &he), "a second resume is refused: %v", err) {
		assert.Equal(t, http.StatusConflict, he.StatusCode)
	}

	done := awaitRun(t, c, id, testdeadline.Scale(2*time.Minute), terminal, "did not end after its resume")
	assert.Equal(t, model.StatusSucceeded, done.Status, done.Error)
	assert.Equal(t, int64(2), done.Epoch, "resumed under a second lease")
	out, err := c.Output(ctx, id, 0, false)
	require.NoError(t, err)
	defer out.Close()
	b, err := io.ReadAll(out)
	require.NoError(t, err)
	assert.Equal(t, "first\nresumed after first\n", string(b), "the stream goes on after the pause")
}

// Forks of a run paused by its worker are asked for through `taskrun
// serve`: each is a run of its own, naming its parent, started by a worker
// from the parent's kept home (runc: a files-only checkpoint), where it
// finds what the parent left and ends SUCCEEDED with the fork's prompt;
// the parent stays PAUSED.
func TestForkAPausedRunThroughServe(t *testing.T) {
	env := newCrashEnv(t)
	serve := startServeProcs(t, env, "sqlite://"+filepath.Join(t.TempDir(), "cp.db"), 1, fleetLeaseTTL())[0]
	c, err := client.New(serve.url, fleetUserToken, nil)
	require.NoError(t, err)
	ctx := context.Background()
	sub, err := c.Submit(ctx, controlplane.SubmitRequest{Prompt: "parent", Image: testImage, Runtime: "runc",
		KeepAlive: true, IdleTimeoutMillis: 2000,
		Command: []string{"sh", "-c", `cd "$HOME" && if [ -f mark ]; then echo "fork after $(cat mark): $(cat "$TASKRUN_PROMPT_FILE")"; exit 0; fi; echo first > mark; echo first; exec sleep 600`}}, nil)
	require.NoError(t, err)
	id := sub.RunID

	newWorkerFleet(t, env, serve.url).startOn(serve.url, "", 2, "--live-listen", freeAddr(t), "--pause-on-idle")
	paused := awaitRun(t, c, id, testdeadline.Scale(2*time.Minute), func(r controlplane.Run) bool {
		return r.Status == model.StatusPaused || r.Status.Terminal()
	}, "never paused")
	require.Equal(t, model.StatusPaused, paused.Status, paused.Error)

	forks, err := c.Fork(ctx, id, controlplane.ForkRequest{N: 2, Prompt: "fork prompt"})
	require.NoError(t, err)
	require.Len(t, forks, 2)
	for _, f := range forks {
		done := awaitRun(t, c, f.ID, testdeadline.Scale(2*time.Minute), terminal, "fork did not end")
		assert.Equal(t, model.StatusSucceeded, done.Status, done.Error)
		assert.Equal(t, id, done.ParentRunID)
		assert.Equal(t, "fork after first: fork prompt\n", done.Output, "the fork starts in the parent's kept home, with its own prompt")
	}
	parent, err := c.GetRun(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, model.StatusPaused, parent.Status, "the parent is only read")
}
