// Package storetest is the conformance suite every controlplane.Store passes
// (run by controlplane/sqlite and controlplane/postgres against real
// databases): queueing, exclusive leasing under concurrency, fencing, the
// stream's offset rules, lease expiry and requeueing, and cancellation.
package storetest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// Opener returns a fresh, empty, migrated store for one test; the suite
// closes it.
type Opener func(t *testing.T) controlplane.Store

var t0 = time.UnixMilli(1767225600000).UTC()

const ttl = 15 * time.Second

// Run runs the suite against the stores open returns.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		f    func(*testing.T, controlplane.Store)
	}{
		{"CreateGetList", testCreateGetList},
		{"LeaseOldestFirstThatFits", testLeaseOrder},
		{"LeaseExclusiveUnderConcurrency", testLeaseExclusive},
		{"FenceRefusesStaleAndExpired", testFence},
		{"FenceRefusesWhoIsNotTheHolder", testFenceHolder},
		{"PatchTerminalFirstWins", testPatchTerminal},
		{"StreamOffsetRules", testStream},
		{"ExpiredLeaseFailsWorkerLost", testExpireFails},
		{"ExpiredRetryableRequeuedWithHigherEpoch", testExpireRequeues},
		{"Cancel", testCancel},
		{"ReturnUndeliveredLease", testReturnLease},
		{"WorkerHeartbeats", testWorkers},
		{"CancelledRunWhoseWorkerIsLostEndsCancelled", testCancelThenLost},
		{"QueuedPastTheTTLEndsFailed", testExpireQueued},
		{"ResumePausedExactlyOneWins", testResume},
		{"ForkQueuesRunsNamingTheirParent", testFork},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() { s.Close() })
			require.NoError(t, s.Ready(context.Background()))
			tc.f(t, s)
		})
	}
}

// Submit creates task tid with its run rid, created at t0+i seconds.
func Submit(t testing.TB, s controlplane.Store, rid string, i int, spec controlplane.TaskSpec) controlplane.Run {
	t.Helper()
	r, err := s.CreateTask(context.Background(), controlplane.NewTask{
		Task:      model.Task{ID: "t-" + rid, UserID: "u1", ConversationID: "c1", Prompt: "do " + rid},
		RunID:     rid,
		SessionID: "s1",
		Spec:      spec,
		CreatedAt: t0.Add(time.Duration(i) * time.Second),
	})
	require.NoError(t, err)
	return r
}

// testHolder and testToken bind the suite's leases, but those of
// testFenceHolder, so that the other tests fence by epoch alone.
const testHolder = "worker"

var testToken = sha256.Sum256([]byte("lease token"))

// F is the fence of the suite's leases at epoch.
func F(epoch int64) controlplane.Fence {
	return controlplane.Fence{Epoch: epoch, TokenHash: testToken, Holder: testHolder}
}

func lease(t *testing.T, s controlplane.Store, worker string, now time.Time) *controlplane.Run {
	t.Helper()
	r, err := s.Lease(context.Background(), controlplane.LeaseOffer{Holder: testHolder, TokenHash: testToken, WorkerID: worker, Now: now, TTL: ttl})
	require.NoError(t, err)
	return r
}

func testCreateGetList(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	spec := controlplane.TaskSpec{Model: "scripted", Image: "taskrun/agent:local", Runtime: "runc",
		Limits:    workerclient.Limits{MemoryBytes: 1 << 30},
		Workspace: &workerclient.StoredObject{Key: "k", Size: 3, SHA256: "abc"}}
	r := Submit(t, s, "r1", 0, spec)
	assert.Equal(t, model.StatusQueued, r.Status)
	assert.Equal(t, int64(0), r.Epoch)
	Submit(t, s, "r2", 1, controlplane.TaskSpec{})

	got, err := s.GetRun(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, spec, got.Spec)
	assert.Equal(t, "do r1", got.Task.Prompt)
	assert.Equal(t, "u1", got.Task.UserID)
	assert.True(t, got.CreatedAt.Equal(t0))

	_, err = s.GetRun(ctx, "nope")
	assert.ErrorIs(t, err, controlplane.ErrNotFound)

	list, err := s.ListRuns(ctx, controlplane.RunFilter{})
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, "r2", list[0].ID, "newest first")
	list, err = s.ListRuns(ctx, controlplane.RunFilter{Limit: 1})
	require.NoError(t, err)
	assert.Len(t, list, 1)
	list, err = s.ListRuns(ctx, controlplane.RunFilter{UserID: "other"})
	require.NoError(t, err)
	assert.Empty(t, list)

	require.NotNil(t, lease(t, s, "w1", t0))
	list, err = s.ListRuns(ctx, controlplane.RunFilter{Status: model.StatusRunning})
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "r1", list[0].ID)
	counts, err := s.CountByStatus(ctx, "")
	require.NoError(t, err)
	assert.Equal(t, map[model.RunStatus]int{model.StatusRunning: 1, model.StatusQueued: 1}, counts)
	counts, err = s.CountByStatus(ctx, "u1")
	require.NoError(t, err)
	assert.Equal(t, map[model.RunStatus]int{model.StatusRunning: 1, model.StatusQueued: 1}, counts)
	counts, err = s.CountByStatus(ctx, "other")
	require.NoError(t, err)
	assert.Empty(t, counts)
}

func testLeaseOrder(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "big", 0, controlplane.TaskSpec{Limits: workerclient.Limits{MemoryBytes: 8 << 30}})
	Submit(t, s, "small", 1, controlplane.TaskSpec{})
	Submit(t, s, "small2", 2, controlplane.TaskSpec{})
	assert.Nil(t, mustLease(t, s, controlplane.LeaseOffer{Holder: testHolder, TokenHash: testToken, WorkerID: "w", Now: t0, TTL: ttl, Fits: func(controlplane.Run) bool { return false }}))

	fitsSmall := func(r controlplane.Run) bool { return r.Spec.Limits.MemoryBytes <= 1<<30 }
	r := mustLease(t, s, controlplane.LeaseOffer{Holder: testHolder, TokenHash: testToken, WorkerID: "w1", Now: t0, TTL: ttl, Fits: fitsSmall})
	require.NotNil(t, r)
	assert.Equal(t, "small", r.ID, "the oldest run that fits")
	assert.Equal(t, model.StatusRunning, r.Status)
	assert.Equal(t, int64(1), r.Epoch)
	assert.Equal(t, "w1", r.WorkerID)
	require.NotNil(t, r.LeaseExpiresAt)
	assert.True(t, r.LeaseExpiresAt.Equal(t0.Add(ttl)))

	r = lease(t, s, "w2", t0)
	require.NotNil(t, r)
	assert.Equal(t, "big", r.ID)
	r = lease(t, s, "w2", t0)
	require.NotNil(t, r)
	assert.Equal(t, "small2", r.ID)
	assert.Nil(t, lease(t, s, "w2", t0), "queue is empty")
	_ = ctx
}

func mustLease(t *testing.T, s controlplane.Store, o controlplane.LeaseOffer) *controlplane.Run {
	t.Helper()
	r, err := s.Lease(context.Background(), o)
	require.NoError(t, err)
	return r
}

func testLeaseExclusive(t *testing.T, s controlplane.Store) {
	const runs, callers = 40, 16
	for i := range runs {
		Submit(t, s, fmt.Sprintf("r%02d", i), i, controlplane.TaskSpec{})
	}
	got := LeaseConcurrently(t, []controlplane.Store{s}, callers, t0)
	assert.Len(t, got, runs, "every run leased exactly once")
}

// LeaseConcurrently has callers goroutines, spread over stores, lease until
// the queue is empty, and returns who got each run. It fails t when any run
// is handed out twice or with an epoch other than 1.
func LeaseConcurrently(t *testing.T, stores []controlplane.Store, callers int, now time.Time) map[string]string {
	t.Helper()
	var (
		mu   sync.Mutex
		got  = map[string]string{}
		errs []error
		wg   sync.WaitGroup
	)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[c%len(stores)]
			w := fmt.Sprintf("w%d", c)
			for {
				r, err := s.Lease(context.Background(), controlplane.LeaseOffer{Holder: testHolder, TokenHash: testToken, WorkerID: w, Now: now, TTL: ttl})
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case r == nil:
				case got[r.ID] != "":
					errs = append(errs, fmt.Errorf("run %s leased to %s and %s", r.ID, got[r.ID], w))
				case r.Epoch != 1:
					errs = append(errs, fmt.Errorf("run %s first leased with epoch %d", r.ID, r.Epoch))
				default:
					got[r.ID] = w
				}
				mu.Unlock()
				if err != nil || r == nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	return got
}

func testFence(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "r1", 0, controlplane.TaskSpec{})
	r := lease(t, s, "w1", t0)
	require.NotNil(t, r)
	running := workerclient.PatchTaskRunRequest{Status: model.StatusRunning}

	_, err := s.Renew(ctx, "r1", F(2), t0.Add(time.Second), ttl)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence, "wrong epoch")
	_, _, err = s.Patch(ctx, "r1", F(0), t0, running)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence, "no epoch")
	_, err = s.AppendOutput(ctx, "r1", F(7), t0, 0, []byte("x"), 0)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence)
	_, err = s.EndOutput(ctx, "r1", F(7), t0, 0)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence)

	rn, err := s.Renew(ctx, "r1", F(1), t0.Add(10*time.Second), ttl)
	require.NoError(t, err)
	assert.True(t, rn.LeaseExpiresAt.Equal(t0.Add(10*time.Second+ttl)))
	_, changed, err := s.Patch(ctx, "r1", F(1), t0.Add(20*time.Second), running)
	require.NoError(t, err, "within the renewed lease")
	assert.True(t, changed)

	late := t0.Add(10*time.Second + ttl)
	_, err = s.Renew(ctx, "r1", F(1), late, ttl)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence, "expired, even before the sweeper ran")
	_, _, err = s.Patch(ctx, "r1", F(1), late, running)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence)
	_, err = s.AppendOutput(ctx, "r1", F(1), late, 0, []byte("x"), 0)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence)

	_, err = s.Renew(ctx, "missing", F(1), t0, ttl)
	assert.ErrorIs(t, err, controlplane.ErrNotFound)
}

// testFenceHolder: the current epoch is not enough. A call with another
// token, or the lease's token with another worker's credential, is refused
// (ErrNotHolder) on every write, and changes nothing; a token of an earlier
// lease is stale once the run was leased again.
func testFenceHolder(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "r1", 0, controlplane.TaskSpec{Retryable: true})
	tokA, tokB := sha256.Sum256([]byte("token a")), sha256.Sum256([]byte("token b"))
	r := mustLease(t, s, controlplane.LeaseOffer{Holder: "wa", TokenHash: tokA, WorkerID: "host-a/1", Now: t0, TTL: ttl})
	require.NotNil(t, r)
	done := workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded}
	forged := []controlplane.Fence{
		{Epoch: 1, TokenHash: tokB, Holder: "wa"},     // a guessed token
		{Epoch: 1, TokenHash: tokA, Holder: "wb"},     // the token, another worker's credential
		{Epoch: 1, TokenHash: tokB, Holder: "wb"},     // another worker altogether
		{Epoch: 1, Holder: "wa"},                      // no token
		{Epoch: 1, TokenHash: tokA},                   // no credential
		{Epoch: 1, TokenHash: [32]byte{}, Holder: ""}, // nothing but the epoch
	}
	for i, f := range forged {
		_, _, err := s.Patch(ctx, "r1", f, t0.Add(time.Second), done)
		assert.ErrorIs(t, err, controlplane.ErrNotHolder, "forged PATCH %d", i)
		_, err = s.Renew(ctx, "r1", f, t0.Add(time.Second), ttl)
		assert.ErrorIs(t, err, controlplane.ErrNotHolder, "forged renewal %d", i)
		_, err = s.AppendOutput(ctx, "r1", f, t0.Add(time.Second), 0, []byte("forged"), 0)
		assert.ErrorIs(t, err, controlplane.ErrNotHolder, "forged stream %d", i)
		_, err = s.EndOutput(ctx, "r1", f, t0.Add(time.Second), 0)
		assert.ErrorIs(t, err, controlplane.ErrNotHolder, "forged end %d", i)
	}
	got, err := s.GetRun(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, model.StatusRunning, got.Status, "no forged call changed the run")
	assert.Zero(t, got.StreamNext)
	assert.True(t, got.LeaseExpiresAt.Equal(t0.Add(ttl)), "no forged renewal extended the lease")

	holder := controlplane.Fence{Epoch: 1, TokenHash: tokA, Holder: "wa"}
	_, err = s.Renew(ctx, "r1", holder, t0.Add(time.Second), ttl)
	require.NoError(t, err, "the holder is fine")

	// The lease expires and the run is leased again, to wb: wa's token is
	// stale, and wb's epoch with wa's token is not wb's lease.
	_, err = s.ExpireLeases(ctx, t0.Add(time.Hour))
	require.NoError(t, err)
	r = mustLease(t, s, controlplane.LeaseOffer{Holder: "wb", TokenHash: tokB, WorkerID: "host-b/1", Now: t0.Add(time.Hour), TTL: ttl})
	require.NotNil(t, r)
	require.Equal(t, int64(2), r.Epoch)
	_, _, err = s.Patch(ctx, "r1", holder, t0.Add(time.Hour), done)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence)
	_, _, err = s.Patch(ctx, "r1", controlplane.Fence{Epoch: 2, TokenHash: tokA, Holder: "wa"}, t0.Add(time.Hour), done)
	assert.ErrorIs(t, err, controlplane.ErrNotHolder)
	_, changed, err := s.Patch(ctx, "r1", controlplane.Fence{Epoch: 2, TokenHash: tokB, Holder: "wb"}, t0.Add(time.Hour), done)
	require.NoError(t, err)
	assert.True(t, changed)
}

func testPatchTerminal(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "r1", 0, controlplane.TaskSpec{})
	require.NotNil(t, lease(t, s, "w1", t0))
	start, end := t0.Add(time.Second).UnixMilli(), t0.Add(time.Minute).UnixMilli()
	out, exit, pt, ct := "all done", 0, 120, 30
	_, _, err := s.Patch(ctx, "r1", F(1), t0.Add(time.Second), workerclient.PatchTaskRunRequest{Status: model.StatusRunning, StartedAt: &start,
		Container: &workerclient.ContainerInfo{ID: "c1", ImageDigest: "sha256:aa", Runtime: "runc"}})
	require.NoError(t, err)
	done := workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded, EndedAt: &end, Output: &out, ExitCode: &exit, PromptTokens: &pt, CompletionTokens: &ct,
		Artifact: &workerclient.Artifact{Key: "a", Size: 1, SHA256: "s"}, Changes: &workerclient.ChangeSet{Files: 2, Added: 1, Modified: 1}}
	r, changed, err := s.Patch(ctx, "r1", F(1), t0.Add(2*time.Second), done)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, model.StatusSucceeded, r.Status)
	assert.Equal(t, "all done", r.Output)
	require.NotNil(t, r.ExitCode)
	assert.Equal(t, 0, *r.ExitCode)
	assert.Equal(t, int64(120), r.PromptTokens)
	assert.Equal(t, int64(30), r.CompletionTokens)
	assert.Equal(t, "sha256:aa", r.Container.ImageDigest, "earlier fields kept")
	assert.Equal(t, 2, r.Changes.Files)
	assert.True(t, r.StartedAt.Equal(time.UnixMilli(start)))
	assert.Nil(t, r.LeaseExpiresAt, "a terminal status ends the lease")

	msg := "late failure"
	r, changed, err = s.Patch(ctx, "r1", F(1), t0.Add(time.Hour), workerclient.PatchTaskRunRequest{Status: model.StatusFailed, Error: &msg})
	require.NoError(t, err, "a repeated terminal PATCH with the same epoch is accepted")
	assert.False(t, changed)
	assert.Equal(t, model.StatusSucceeded, r.Status, "the first terminal status wins")
	assert.Empty(t, r.Error)
	_, err = s.Renew(ctx, "r1", F(1), t0.Add(3*time.Second), ttl)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence, "no lease left to renew")
}

func testStream(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "r1", 0, controlplane.TaskSpec{})
	require.NotNil(t, lease(t, s, "w1", t0))
	now := t0.Add(time.Second)
	app := func(off int64, data string) (int64, error) {
		return s.AppendOutput(ctx, "r1", F(1), now, off, []byte(data), 64)
	}
	n, err := app(0, "hello ")
	require.NoError(t, err)
	assert.Equal(t, int64(6), n)
	n, err = app(0, "hello ")
	require.NoError(t, err, "duplicate dropped")
	assert.Equal(t, int64(6), n)
	n, err = app(3, "lo world")
	require.NoError(t, err, "overlap: held prefix dropped")
	assert.Equal(t, int64(11), n)
	_, err = app(20, "x")
	assert.ErrorIs(t, err, controlplane.ErrConflict, "gap")
	_, err = app(6, "WORLD!")
	assert.ErrorIs(t, err, controlplane.ErrConflict, "overlapping bytes differ")
	_, err = app(11, string(make([]byte, 60)))
	assert.ErrorIs(t, err, controlplane.ErrTooLarge, "over the cap")
	n, err = app(11, "!")
	require.NoError(t, err)
	assert.Equal(t, int64(12), n)

	data, r, err := s.ReadOutput(ctx, "r1", 0, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, "hello world!", string(data))
	assert.False(t, r.StreamEnded)
	data, _, err = s.ReadOutput(ctx, "r1", 4, 5)
	require.NoError(t, err)
	assert.Equal(t, "o wor", string(data))
	data, _, err = s.ReadOutput(ctx, "r1", 12, 5)
	require.NoError(t, err)
	assert.Empty(t, data)

	_, err = s.EndOutput(ctx, "r1", F(1), now, 11)
	assert.ErrorIs(t, err, controlplane.ErrConflict, "wrong total")
	n, err = s.EndOutput(ctx, "r1", F(1), now, 12)
	require.NoError(t, err)
	assert.Equal(t, int64(12), n)
	_, err = s.EndOutput(ctx, "r1", F(1), now, 12)
	require.NoError(t, err, "repeated end")
	_, err = app(12, "more")
	assert.ErrorIs(t, err, controlplane.ErrConflict, "past the end")
	_, err = app(6, "world")
	require.NoError(t, err, "a duplicate after the end is still harmless")
	_, r, err = s.ReadOutput(ctx, "r1", 0, 1)
	require.NoError(t, err)
	assert.True(t, r.StreamEnded)
	assert.Equal(t, int64(12), r.StreamNext)
}

func testExpireFails(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "r1", 0, controlplane.TaskSpec{})
	Submit(t, s, "r2", 1, controlplane.TaskSpec{})
	require.NotNil(t, lease(t, s, "w1", t0))
	require.NotNil(t, lease(t, s, "w2", t0.Add(5*time.Second)))

	ex, err := s.ExpireLeases(ctx, t0.Add(ttl-time.Millisecond))
	require.NoError(t, err)
	assert.Empty(t, ex, "nothing lapsed yet")
	ex, err = s.ExpireLeases(ctx, t0.Add(ttl))
	require.NoError(t, err)
	assert.Equal(t, []controlplane.Expired{{RunID: "r1", Status: model.StatusFailed}}, ex)

	r, err := s.GetRun(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, model.StatusFailed, r.Status)
	assert.Equal(t, controlplane.ErrorWorkerLost, r.Error)
	require.NotNil(t, r.EndedAt)
	r2, err := s.GetRun(ctx, "r2")
	require.NoError(t, err)
	assert.Equal(t, model.StatusRunning, r2.Status, "its lease is still good")

	// The lost worker comes back: refused, whatever it sends.
	_, _, err = s.Patch(ctx, "r1", F(1), t0.Add(ttl), workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded})
	assert.ErrorIs(t, err, controlplane.ErrStaleFence)
	assert.Nil(t, lease(t, s, "w3", t0.Add(time.Hour)), "a non-retryable run is never executed again")
}

func testExpireRequeues(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "r1", 0, controlplane.TaskSpec{Retryable: true})
	require.NotNil(t, lease(t, s, "w1", t0))
	_, err := s.AppendOutput(ctx, "r1", F(1), t0, 0, []byte("partial"), 0)
	require.NoError(t, err)

	now := t0.Add(ttl)
	for attempt := 1; attempt <= controlplane.MaxAttempts; attempt++ {
		ex, err := s.ExpireLeases(ctx, now)
		require.NoError(t, err)
		require.Len(t, ex, 1)
		if attempt == controlplane.MaxAttempts {
			assert.Equal(t, model.StatusFailed, ex[0].Status, "attempts are bounded")
			r, err := s.GetRun(ctx, "r1")
			require.NoError(t, err)
			assert.Contains(t, r.Error, controlplane.ErrorWorkerLost)
			break
		}
		assert.True(t, ex[0].Requeued)
		r, err := s.GetRun(ctx, "r1")
		require.NoError(t, err)
		assert.Equal(t, model.StatusQueued, r.Status)
		assert.Equal(t, int64(0), r.StreamNext, "the next attempt's stream starts over")

		_, _, err = s.Patch(ctx, "r1", F(int64(attempt)), now, workerclient.PatchTaskRunRequest{Status: model.StatusRunning})
		assert.ErrorIs(t, err, controlplane.ErrStaleFence, "the lost worker's epoch is dead")

		got := lease(t, s, "w2", now)
		require.NotNil(t, got)
		assert.Equal(t, int64(attempt+1), got.Epoch, "a higher epoch")
		assert.Equal(t, attempt+1, got.Attempts)
		_, err = s.AppendOutput(ctx, "r1", F(got.Epoch), now, 0, []byte("other"), 0)
		require.NoError(t, err, "the new attempt writes from offset 0")
		now = now.Add(ttl)
	}
}

func testCancel(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "q", 0, controlplane.TaskSpec{})
	Submit(t, s, "l", 1, controlplane.TaskSpec{})
	r, err := s.Cancel(ctx, "q", t0)
	require.NoError(t, err)
	assert.Equal(t, model.StatusCancelled, r.Status, "a queued run ends at once")
	got := lease(t, s, "w", t0)
	require.NotNil(t, got)
	assert.Equal(t, "l", got.ID, "a cancelled run is never leased")

	r, err = s.Cancel(ctx, "l", t0)
	require.NoError(t, err)
	assert.Equal(t, model.StatusRunning, r.Status)
	assert.True(t, r.CancelRequested)
	rn, err := s.Renew(ctx, "l", F(1), t0.Add(time.Second), ttl)
	require.NoError(t, err)
	assert.True(t, rn.CancelRequested, "the worker learns at its next renewal")
	_, _, err = s.Patch(ctx, "l", F(1), t0.Add(2*time.Second), workerclient.PatchTaskRunRequest{Status: model.StatusCancelled})
	require.NoError(t, err)
	_, err = s.Cancel(ctx, "l", t0)
	assert.ErrorIs(t, err, controlplane.ErrFinished)
	_, err = s.Cancel(ctx, "missing", t0)
	assert.ErrorIs(t, err, controlplane.ErrNotFound)
}

// BenchLeaseCycle measures one run's life in the store: submit, lease,
// report RUNNING, append 4 KiB of output, report SUCCEEDED.
func BenchLeaseCycle(b *testing.B, s controlplane.Store) {
	ctx := context.Background()
	chunk := make([]byte, 4<<10)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		rid := fmt.Sprintf("b%09d", i)
		Submit(b, s, rid, i, controlplane.TaskSpec{})
		r, err := s.Lease(ctx, controlplane.LeaseOffer{Holder: testHolder, TokenHash: testToken, WorkerID: "w", Now: t0, TTL: time.Hour})
		if err != nil || r == nil {
			b.Fatalf("lease: %v %v", r, err)
		}
		if _, _, err := s.Patch(ctx, r.ID, F(r.Epoch), t0, workerclient.PatchTaskRunRequest{Status: model.StatusRunning}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.AppendOutput(ctx, r.ID, F(r.Epoch), t0, 0, chunk, 0); err != nil {
			b.Fatal(err)
		}
		if _, _, err := s.Patch(ctx, r.ID, F(r.Epoch), t0, workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded}); err != nil {
			b.Fatal(err)
		}
	}
}

func testCancelThenLost(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "r1", 0, controlplane.TaskSpec{Retryable: true})
	require.NotNil(t, lease(t, s, "w1", t0))
	_, err := s.Cancel(ctx, "r1", t0)
	require.NoError(t, err)
	ex, err := s.ExpireLeases(ctx, t0.Add(ttl))
	require.NoError(t, err)
	assert.Equal(t, []controlplane.Expired{{RunID: "r1", Status: model.StatusCancelled}}, ex, "not requeued: its owner cancelled it")
	r, err := s.GetRun(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, model.StatusCancelled, r.Status)
	assert.Nil(t, lease(t, s, "w2", t0.Add(ttl)))
}

// testReturnLease: a lease granted to a long poll whose client had gone is
// put back, uncounted, with its epoch fenced; a lease whose worker spoke, or
// that is no longer current, is left alone.
func testReturnLease(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "r1", 0, controlplane.TaskSpec{})
	got := lease(t, s, "w1", t0)
	require.NotNil(t, got)
	require.Equal(t, 1, got.Attempts)

	back, err := s.ReturnLease(ctx, "r1", got.Epoch, t0.Add(time.Second))
	require.NoError(t, err)
	assert.True(t, back)
	r, err := s.GetRun(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, model.StatusQueued, r.Status, "the run waits for another lease")
	assert.Zero(t, r.Attempts, "an undelivered lease is no attempt")
	assert.Equal(t, got.Epoch, r.Epoch, "the epoch stays raised")
	_, err = s.Renew(ctx, "r1", F(got.Epoch), t0.Add(time.Second), ttl)
	assert.ErrorIs(t, err, controlplane.ErrStaleFence, "the returned epoch is dead")
	_, _, err = s.Patch(ctx, "r1", F(got.Epoch), t0.Add(time.Second), workerclient.PatchTaskRunRequest{Status: model.StatusRunning})
	assert.ErrorIs(t, err, controlplane.ErrStaleFence)
	ex, err := s.ExpireLeases(ctx, t0.Add(time.Hour))
	require.NoError(t, err)
	assert.Empty(t, ex, "nothing is left to be found lost")

	again := lease(t, s, "w2", t0.Add(2*time.Second))
	require.NotNil(t, again, "the run is leased again")
	assert.Equal(t, got.Epoch+1, again.Epoch)
	assert.Equal(t, 1, again.Attempts)
	back, err = s.ReturnLease(ctx, "r1", got.Epoch, t0.Add(2*time.Second))
	require.NoError(t, err)
	assert.False(t, back, "a stale epoch returns nothing")

	// Once its worker reported, the lease was delivered: it stays.
	started := t0.Add(3 * time.Second).UnixMilli()
	_, _, err = s.Patch(ctx, "r1", F(again.Epoch), t0.Add(3*time.Second), workerclient.PatchTaskRunRequest{Status: model.StatusRunning, StartedAt: &started})
	require.NoError(t, err)
	back, err = s.ReturnLease(ctx, "r1", again.Epoch, t0.Add(3*time.Second))
	require.NoError(t, err)
	assert.False(t, back)
	r, err = s.GetRun(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, model.StatusRunning, r.Status)
	_, err = s.Renew(ctx, "r1", F(again.Epoch), t0.Add(4*time.Second), ttl)
	assert.NoError(t, err, "the delivered lease still holds")

	// A cancel asked while the answer was undeliverable ends the run.
	Submit(t, s, "c1", 1, controlplane.TaskSpec{})
	c := lease(t, s, "w1", t0)
	require.NotNil(t, c)
	_, err = s.Cancel(ctx, "c1", t0)
	require.NoError(t, err)
	back, err = s.ReturnLease(ctx, "c1", c.Epoch, t0.Add(time.Second))
	require.NoError(t, err)
	assert.True(t, back)
	r, err = s.GetRun(ctx, "c1")
	require.NoError(t, err)
	assert.Equal(t, model.StatusCancelled, r.Status)
	assert.Nil(t, lease(t, s, "w1", t0.Add(2*time.Second)), "a cancelled run is never leased")

	back, err = s.ReturnLease(ctx, "missing", 1, t0)
	assert.ErrorIs(t, err, controlplane.ErrNotFound)
	assert.False(t, back)
}

// testWorkers: a worker's last lease request is its heartbeat; a stale
// report never replaces a newer one.
func testWorkers(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	ws, err := s.ListWorkers(ctx, time.Time{})
	require.NoError(t, err)
	assert.Empty(t, ws)

	a := controlplane.Worker{ID: "host-a/1", LastSeen: t0,
		Capacity: workerclient.Capacity{Slots: 4, FreeSlots: 4, FreeMemoryBytes: 8 << 30, FreeDiskBytes: 100 << 30},
		Labels:   workerclient.WorkerLabels{Runtimes: []string{"runc", "runsc"}, Images: []string{"img"}, Backend: "docker"}}
	require.NoError(t, s.RecordWorker(ctx, a))
	b := controlplane.Worker{ID: "host-b/1", LastSeen: t0.Add(time.Second), Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1},
		Labels: workerclient.WorkerLabels{Runtimes: []string{"runc"}, CanPull: true}}
	require.NoError(t, s.RecordWorker(ctx, b))
	a.Capacity.FreeSlots, a.LastSeen = 1, t0.Add(2*time.Second)
	require.NoError(t, s.RecordWorker(ctx, a))
	stale := a
	stale.Capacity.FreeSlots, stale.LastSeen = 3, t0.Add(time.Second)
	require.NoError(t, s.RecordWorker(ctx, stale), "a replica with a lagging clock")

	ws, err = s.ListWorkers(ctx, time.Time{})
	require.NoError(t, err)
	require.Len(t, ws, 2)
	assert.Equal(t, a.ID, ws[0].ID, "most recently seen first")
	assert.Equal(t, a.Capacity, ws[0].Capacity, "the latest report wins")
	assert.Equal(t, a.Labels, ws[0].Labels)
	assert.True(t, a.LastSeen.Equal(ws[0].LastSeen), "%s != %s", a.LastSeen, ws[0].LastSeen)
	assert.Equal(t, b.Labels, ws[1].Labels)

	ws, err = s.ListWorkers(ctx, t0.Add(2*time.Second))
	require.NoError(t, err)
	require.Len(t, ws, 1, "only workers seen since")
	assert.Equal(t, a.ID, ws[0].ID)
}

// testExpireQueued: runs still queued when submitted before the cut-off end
// FAILED with the reason; newer queued runs and leased runs are untouched.
func testExpireQueued(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "old", 0, controlplane.TaskSpec{})
	Submit(t, s, "taken", 1, controlplane.TaskSpec{})
	Submit(t, s, "new", 10, controlplane.TaskSpec{})
	_, err := s.Cancel(ctx, "old", t0) // ended already: not expired again
	require.NoError(t, err)
	Submit(t, s, "old2", 2, controlplane.TaskSpec{})
	got := lease(t, s, "w1", t0.Add(3*time.Second))
	require.NotNil(t, got)
	require.Equal(t, "taken", got.ID)

	now := t0.Add(time.Hour)
	ids, err := s.ExpireQueued(ctx, t0.Add(5*time.Second), now, "expired in the queue: test")
	require.NoError(t, err)
	assert.Equal(t, []string{"old2"}, ids)
	r, err := s.GetRun(ctx, "old2")
	require.NoError(t, err)
	assert.Equal(t, model.StatusFailed, r.Status)
	assert.Equal(t, "expired in the queue: test", r.Error)
	require.NotNil(t, r.EndedAt)
	assert.True(t, r.EndedAt.Equal(now))
	for id, want := range map[string]model.RunStatus{"old": model.StatusCancelled, "taken": model.StatusRunning, "new": model.StatusQueued} {
		r, err := s.GetRun(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, want, r.Status, id)
	}
	ids, err = s.ExpireQueued(ctx, t0.Add(5*time.Second), now, "again")
	require.NoError(t, err)
	assert.Empty(t, ids, "an expired run is not expired twice")
}

// testResume: a paused run is resumed back into the queue, marked Resume,
// by exactly one of many concurrent resumes (the others: ErrConflict), and
// is leased again with a higher epoch; it is not expired from the queue.
// Resuming a run that is not PAUSED, or does not exist, is refused.
func testResume(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "r1", 0, controlplane.TaskSpec{})
	_, err := s.Resume(ctx, "r1", t0)
	assert.ErrorIs(t, err, controlplane.ErrConflict, "a queued run is not resumed")
	_, err = s.Resume(ctx, "nope", t0)
	assert.ErrorIs(t, err, controlplane.ErrNotFound)

	require.NotNil(t, lease(t, s, "w1", t0))
	_, err = s.AppendOutput(ctx, "r1", F(1), t0.Add(time.Second), 0, []byte("before"), 0)
	require.NoError(t, err)
	_, err = s.EndOutput(ctx, "r1", F(1), t0.Add(time.Second), 6)
	require.NoError(t, err)
	_, _, err = s.Patch(ctx, "r1", F(1), t0.Add(time.Second), workerclient.PatchTaskRunRequest{Status: model.StatusPaused})
	require.NoError(t, err)

	const callers = 16
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		won      int
		conflict int
		other    []error
	)
	start := make(chan struct{})
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := s.Resume(ctx, "r1", t0.Add(2*time.Second))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
				assert.Equal(t, model.StatusQueued, r.Status)
				assert.True(t, r.Resume)
			case errors.Is(err, controlplane.ErrConflict):
				conflict++
			default:
				other = append(other, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Empty(t, other)
	assert.Equal(t, 1, won, "exactly one resume wins")
	assert.Equal(t, callers-1, conflict, "the others are told it is no longer paused")

	r, err := s.GetRun(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, model.StatusQueued, r.Status)
	assert.True(t, r.Resume)
	assert.False(t, r.StreamEnded, "the resumed run's stream goes on")
	assert.Equal(t, int64(6), r.StreamNext, "from where it stopped")
	ids, err := s.ExpireQueued(ctx, t0.Add(time.Hour), t0.Add(time.Hour), "expired")
	require.NoError(t, err)
	assert.Empty(t, ids, "a resumed run is not expired from the queue")

	got := lease(t, s, "w2", t0.Add(3*time.Second))
	require.NotNil(t, got)
	back, err := s.ReturnLease(ctx, "r1", got.Epoch, t0.Add(3*time.Second))
	require.NoError(t, err)
	assert.True(t, back, "an undelivered lease of a resumed run (started and streamed before its pause) goes back")
	got = lease(t, s, "w2", t0.Add(3*time.Second))
	require.NotNil(t, got)
	assert.Equal(t, "r1", got.ID)
	assert.True(t, got.Resume, "the worker is told to resume it")
	assert.Equal(t, int64(3), got.Epoch)
	next, err := s.AppendOutput(ctx, "r1", F(3), t0.Add(4*time.Second), 6, []byte(" after"), 0)
	require.NoError(t, err)
	assert.Equal(t, int64(12), next)
	_, err = s.Resume(ctx, "r1", t0.Add(4*time.Second))
	assert.ErrorIs(t, err, controlplane.ErrConflict, "a running run is not resumed")
}

// testFork: forks of a paused (or ended) run are new runs of its task,
// QUEUED, naming it as their parent, with the fork's prompt when one is
// given; a parent that is queued or running is refused (ErrConflict), an
// unknown one is not found, and the parent is unchanged.
func testFork(t *testing.T, s controlplane.Store) {
	ctx := context.Background()
	Submit(t, s, "p", 0, controlplane.TaskSpec{Image: "img"})
	_, err := s.Fork(ctx, "p", []string{"f0"}, "", t0)
	assert.ErrorIs(t, err, controlplane.ErrConflict, "a queued run is not forked")
	_, err = s.Fork(ctx, "nope", []string{"f0"}, "", t0)
	assert.ErrorIs(t, err, controlplane.ErrNotFound)
	require.NotNil(t, lease(t, s, "w1", t0))
	_, err = s.Fork(ctx, "p", []string{"f0"}, "", t0)
	assert.ErrorIs(t, err, controlplane.ErrConflict, "a running run is not forked")
	_, _, err = s.Patch(ctx, "p", F(1), t0.Add(time.Second), workerclient.PatchTaskRunRequest{Status: model.StatusPaused})
	require.NoError(t, err)

	forks, err := s.Fork(ctx, "p", []string{"f1", "f2"}, "try another way", t0.Add(2*time.Second))
	require.NoError(t, err)
	require.Len(t, forks, 2)
	plain, err := s.Fork(ctx, "p", []string{"f3"}, "", t0.Add(3*time.Second))
	require.NoError(t, err)
	require.Len(t, plain, 1)
	for _, f := range append(forks, plain...) {
		assert.Equal(t, model.StatusQueued, f.Status, f.ID)
		assert.Equal(t, "p", f.ParentRunID, f.ID)
		assert.Equal(t, "t-p", f.Task.ID, f.ID)
		assert.Equal(t, "u1", f.Task.UserID, f.ID)
		assert.Equal(t, "img", f.Spec.Image, f.ID)
		assert.False(t, f.Resume, f.ID)
	}
	assert.Equal(t, "try another way", forks[0].Task.Prompt)
	assert.Equal(t, "do p", plain[0].Task.Prompt, "no prompt: the parent's")
	parent, err := s.GetRun(ctx, "p")
	require.NoError(t, err)
	assert.Equal(t, model.StatusPaused, parent.Status, "the parent is unchanged")
	assert.Equal(t, "do p", parent.Task.Prompt)
	assert.Empty(t, parent.ParentRunID)

	got := lease(t, s, "w2", t0.Add(4*time.Second))
	require.NotNil(t, got)
	assert.Equal(t, "f1", got.ID, "forks are leased as any queued run, oldest first")
	assert.Equal(t, "p", got.ParentRunID)
	assert.Equal(t, int64(1), got.Epoch)
}
