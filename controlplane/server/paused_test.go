package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// TestPausedRun: a worker reports its run PAUSED. The run is listed as
// PAUSED, has no end, and its lease is over: the sweep does not find it
// lost (FAILED) once the lease would have expired, and no worker leases
// it again; later reports of the old lease change nothing. Cancelled, it
// ends CANCELLED at once, since no worker holds it.
func TestPausedRun(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	a := e.lease(t, 0)
	require.NotNil(t, a)
	require.NoError(t, e.worker.Fenced(a.Lease).UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusPaused}))

	run, err := e.user.GetRun(ctx, sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusPaused, run.Status)
	assert.Nil(t, run.EndedAt, "a paused run has not ended")
	paused, err := e.user.ListRuns(ctx, model.StatusPaused, 0)
	require.NoError(t, err)
	require.Len(t, paused, 1)
	assert.Equal(t, sub.RunID, paused[0].ID)

	e.clock.Add(time.Minute)
	ex, err := e.srv.SweepOnce(ctx)
	require.NoError(t, err)
	assert.Empty(t, ex, "a paused run's lease does not lapse into a lost worker")
	assert.Nil(t, e.lease(t, 0), "a paused run is not leased to run afresh")
	_ = e.worker.Fenced(a.Lease).UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded})
	run, err = e.user.GetRun(ctx, sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusPaused, run.Status, "the old lease reports nothing more")

	run, err = e.user.Cancel(ctx, sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusCancelled, run.Status)
	assert.NotNil(t, run.EndedAt)
}

// TestResumePausedRun: the owner resumes a PAUSED run through the control
// plane. Another tenant is told no such run (404) and changes nothing; the
// owner's resume queues it, marked, and a second resume is refused (409);
// the worker that leases it is told to resume it, and it goes on to
// SUCCEEDED under the new lease.
func TestResumePausedRun(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	_, err = e.user.Resume(ctx, sub.RunID)
	var he *client.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusConflict, he.StatusCode, "a queued run is not resumed")

	a := e.lease(t, 0)
	require.NotNil(t, a)
	assert.False(t, a.Resume)
	require.NoError(t, e.worker.Fenced(a.Lease).UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusPaused}))

	_, err = e.bob.Resume(ctx, sub.RunID)
	require.ErrorIs(t, err, client.ErrNotFound, "another tenant's run is not found")
	run, err := e.user.GetRun(ctx, sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusPaused, run.Status, "another tenant's resume changed nothing")

	run, err = e.user.Resume(ctx, sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusQueued, run.Status)
	assert.True(t, run.Resume)
	_, err = e.user.Resume(ctx, sub.RunID)
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusConflict, he.StatusCode, "a second resume is refused")

	b := e.lease(t, 0)
	require.NotNil(t, b)
	assert.Equal(t, sub.RunID, b.Run.ID)
	assert.True(t, b.Resume, "the worker is told to restore it from its checkpoint")
	assert.Equal(t, a.Lease.Epoch+1, b.Lease.Epoch)
	require.NoError(t, e.worker.Fenced(b.Lease).UpdateRunStatus(ctx, b.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded}))
	run, err = e.user.GetRun(ctx, sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, run.Status)
}

// TestForkPausedRun: the owner forks a PAUSED run through the control
// plane: N runs of its own, QUEUED, each naming the parent, with the fork's
// prompt; the worker that leases one is told its parent. Another tenant is
// told no such run, a bad n is 400, and a run still queued is 409.
func TestForkPausedRun(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	var he *client.HTTPError
	_, err = e.user.Fork(ctx, sub.RunID, controlplane.ForkRequest{N: 1})
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusConflict, he.StatusCode, "a queued run is not forked")
	a := e.lease(t, 0)
	require.NotNil(t, a)
	require.NoError(t, e.worker.Fenced(a.Lease).UpdateRunStatus(ctx, a.Run.ID, &workerclient.PatchTaskRunRequest{Status: model.StatusPaused}))

	_, err = e.bob.Fork(ctx, sub.RunID, controlplane.ForkRequest{N: 1})
	require.ErrorIs(t, err, client.ErrNotFound, "another tenant's run is not found")
	for _, n := range []int{0, controlplane.MaxForks + 1} {
		_, err = e.user.Fork(ctx, sub.RunID, controlplane.ForkRequest{N: n})
		require.ErrorAs(t, err, &he)
		assert.Equal(t, http.StatusBadRequest, he.StatusCode, "n %d", n)
	}
	forks, err := e.user.Fork(ctx, sub.RunID, controlplane.ForkRequest{N: 2, Prompt: "other way"})
	require.NoError(t, err)
	require.Len(t, forks, 2)
	assert.NotEqual(t, forks[0].ID, forks[1].ID)
	for _, f := range forks {
		assert.NotEqual(t, sub.RunID, f.ID)
		assert.Equal(t, sub.RunID, f.ParentRunID)
		assert.Equal(t, model.StatusQueued, f.Status)
		assert.Equal(t, "other way", f.Task.Prompt)
	}
	b := e.lease(t, 0)
	require.NotNil(t, b)
	assert.Equal(t, sub.RunID, b.Run.ParentRunID, "the worker is told the fork's parent")
	assert.Equal(t, "other way", b.Task.Prompt)
	parent, err := e.user.GetRun(ctx, sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusPaused, parent.Status)
}

func TestRunStatusLive(t *testing.T) {
	for s, live := range map[model.RunStatus]bool{model.StatusQueued: true, model.StatusRunning: true, model.StatusPaused: false,
		model.StatusSucceeded: false, model.StatusFailed: false, model.StatusCancelled: false} {
		assert.Equal(t, live, s.Live(), s)
		assert.Equal(t, s != model.StatusPaused && !live, s.Terminal(), s)
	}
}
