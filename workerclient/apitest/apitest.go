// Package apitest is a conformance suite of the worker API
// (docs/control-plane-api.md, "Worker API") as workerclient.Client sees it:
// leases handed out oldest first to the workers they fit, long polls,
// renewals, epochs, expiry and requeue, fencing by epoch and by holder
// (HeaderFence and HeaderLeaseToken: 428, 403, 412), status PATCH, the output
// stream's offset rules, and an owner's cancel.
//
// Run it against every control plane a worker may talk to, so that they
// cannot drift apart: the reference server (controlplane/server through
// controlplane/servertest, on SQLite and PostgreSQL) and the fake the
// worker's own tests use (workerclient/controlplanetest). Each
// implementation adapts itself to ControlPlane; Run does the rest.
package apitest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// Spec is what a submitted run asks of the worker that takes it.
type Spec struct {
	// Retryable lets the control plane queue the run again when its worker
	// is lost.
	Retryable bool
	// Image and Runtime, when set, must be among the worker's labels.
	Image, Runtime string
	// MemoryBytes is the run's memory limit (0: none).
	MemoryBytes int64
}

// RunState is what a control plane records of one run.
type RunState struct {
	// Status is QUEUED, RUNNING or a terminal status.
	Status model.RunStatus
	// Error is the error the run ended with, as reported by its worker or
	// set by the control plane ("worker lost").
	Error string
	// Epoch is the number of the run's current (or last) lease.
	Epoch int64
	// Output is the output stream held; StreamEnded is set once it ended.
	Output      []byte
	StreamEnded bool
}

// ControlPlane is an implementation under test, with the hands the suite
// needs that the worker API does not give: submitting and cancelling runs as
// their owner, moving the clock, and reading what was recorded.
type ControlPlane interface {
	// URL is the base URL for workerclient.New.
	URL() string
	// WorkerToken is the bearer token of worker credential i (0 or 1): two
	// distinct workers.
	WorkerToken(i int) string
	// LeaseTTL is the length of the leases the control plane hands out.
	LeaseTTL() time.Duration
	// Now is the control plane's clock.
	Now() time.Time
	// Submit queues a new run and returns its ID.
	Submit(t *testing.T, s Spec) string
	// Cancel cancels a run as its owner.
	Cancel(t *testing.T, runID string)
	// Advance moves the control plane's clock forward by d and lets it act
	// on the leases that lapsed meanwhile (finalize or requeue their runs).
	Advance(t *testing.T, d time.Duration)
	// Run returns what the control plane records of runID.
	Run(t *testing.T, runID string) RunState
}

// Run runs the suite; newCP returns a fresh control plane for each case,
// stopped at the end of the case's test.
func Run(t *testing.T, newCP func(t *testing.T) ControlPlane) {
	cases := []struct {
		name string
		f    func(t *testing.T, h *harness)
	}{
		{"LeaseHandsOutAQueuedRun", testLeaseHandsOut},
		{"LeaseEmptyQueueAnswersNothing", testLeaseEmpty},
		{"LeaseLongPollGetsALaterRun", testLeaseLongPoll},
		{"LeaseWithoutAFreeSlotAnswersAtOnce", testLeaseNoFreeSlot},
		{"LeaseOnlyRunsThatFitOldestFirst", testLeaseFits},
		{"LeaseNeedsAWorkerID", testLeaseNeedsWorkerID},
		{"WrongBearerTokenIs401", testWrongBearer},
		{"RenewExtendsTheLease", testRenew},
		{"RenewAfterExpiryIsLeaseLost", testRenewAfterExpiry},
		{"RenewOfAnUnknownRunIs404", testRenewUnknown},
		{"CallsWithoutFenceHeadersAre428", testMissingFence},
		{"CallsWithAnotherTokenAre403", testWrongToken},
		{"CallsWithAnotherWorkersCredentialAre403", testOtherWorker},
		{"CallsWithAnotherEpochAre412", testOtherEpoch},
		{"ExpiredRetryableRunIsRequeuedAndFenced", testRequeue},
		{"RetryableRunLostOnItsLastAttemptFails", testMaxAttempts},
		{"PatchReportsStatusFirstTerminalWins", testPatch},
		{"PatchRefusesANonReportableStatus", testPatchBadStatus},
		{"StreamOffsetRules", testStream},
		{"CancelOfALeasedRunIsToldOnRenewal", testCancelLeased},
		{"CancelOfAQueuedRunEndsItAtOnce", testCancelQueued},
		{"CancelledRunWhoseWorkerIsLostEndsCancelled", testCancelThenLost},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cp := newCP(t)
			c.f(t, &harness{cp: cp, ctx: context.Background()})
		})
	}
}

// harness holds one case's control plane and its workers.
type harness struct {
	cp  ControlPlane
	ctx context.Context
}

// noRetry makes every refusal visible at once.
var noRetry = workerclient.RetryPolicy{MaxAttempts: 1, MaxElapsed: time.Minute, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}

// worker returns a client acting as worker credential i.
func (h *harness) worker(i int) *workerclient.Client {
	return workerclient.New(h.cp.URL(), h.cp.WorkerToken(i), workerclient.WithRetryPolicy(noRetry))
}

// capacity is one free slot, no other bound.
var capacity = workerclient.Capacity{Slots: 1, FreeSlots: 1}

// lease takes one run as worker i, requiring that one is handed out.
func (h *harness) lease(t *testing.T, i int) *workerclient.Assignment {
	t.Helper()
	a, err := h.worker(i).AcquireLease(h.ctx, workerclient.LeaseRequest{WorkerID: fmt.Sprintf("worker-%d", i), Capacity: capacity})
	require.NoError(t, err)
	require.NotNil(t, a, "a queued run is handed out")
	return a
}

// none requires that worker i is handed nothing at once.
func (h *harness) none(t *testing.T, i int) {
	t.Helper()
	a, err := h.worker(i).AcquireLease(h.ctx, workerclient.LeaseRequest{WorkerID: fmt.Sprintf("worker-%d", i), Capacity: capacity})
	require.NoError(t, err)
	require.Nil(t, a, "no run is handed out")
}

// status returns the HTTP status of err, or 0.
func status(err error) int {
	var he *workerclient.HTTPError
	if errors.As(err, &he) {
		return he.StatusCode
	}
	return 0
}

// refused requires err to be a refusal with code.
func refused(t *testing.T, err error, code int, what string) {
	t.Helper()
	require.Error(t, err, what)
	assert.Equal(t, code, status(err), "%s: %v", what, err)
	assert.ErrorIs(t, err, workerclient.ErrRejected, what)
	assert.Equal(t, code == http.StatusPreconditionFailed, errors.Is(err, workerclient.ErrLeaseLost), "%s: ErrLeaseLost exactly for 412: %v", what, err)
	assert.Equal(t, code == http.StatusForbidden, errors.Is(err, workerclient.ErrNotHolder), "%s: ErrNotHolder exactly for 403: %v", what, err)
}

// running is the PATCH of a run that started.
func running() *workerclient.PatchTaskRunRequest {
	return &workerclient.PatchTaskRunRequest{Status: model.StatusRunning, StartedAt: ptr(int64(1767225600000))}
}

func ptr[T any](v T) *T { return &v }

func testLeaseHandsOut(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	assert.Equal(t, model.StatusQueued, h.cp.Run(t, id).Status)
	before := h.cp.Now()
	a := h.lease(t, 0)
	after := h.cp.Now()
	ttl := h.cp.LeaseTTL()
	assert.Equal(t, id, a.Lease.RunID)
	assert.Equal(t, id, a.Run.ID)
	assert.Equal(t, int64(1), a.Lease.Epoch, "the first lease has epoch 1")
	assert.GreaterOrEqual(t, len(a.Lease.Token), 22, "the lease token carries at least 128 bits")
	assert.Equal(t, ttl.Milliseconds(), a.Lease.TTLMillis)
	assert.Equal(t, (ttl / 3).Milliseconds(), a.Lease.RenewMillis, "renew every third of the TTL")
	assert.GreaterOrEqual(t, a.Lease.ExpiresAt, before.Add(ttl).UnixMilli(), "the lease lasts its TTL")
	assert.LessOrEqual(t, a.Lease.ExpiresAt, after.Add(ttl).UnixMilli(), "the lease lasts its TTL")
	assert.GreaterOrEqual(t, a.Lease.WaitedMillis, int64(0))
	st := h.cp.Run(t, id)
	assert.Equal(t, model.StatusRunning, st.Status, "a leased run is RUNNING")
	assert.Equal(t, int64(1), st.Epoch)
	h.none(t, 1)
}

func testLeaseEmpty(t *testing.T, h *harness) {
	h.none(t, 0)
}

func testLeaseLongPoll(t *testing.T, h *harness) {
	type answer struct {
		a   *workerclient.Assignment
		err error
	}
	got := make(chan answer, 1)
	start := time.Now()
	go func() {
		a, err := h.worker(0).AcquireLease(h.ctx, workerclient.LeaseRequest{WorkerID: "worker-0", Capacity: capacity, WaitMillis: 20000})
		got <- answer{a, err}
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-got:
		t.Fatalf("the lease call answered before any run was queued: %+v", r)
	default:
	}
	id := h.cp.Submit(t, Spec{})
	r := <-got
	require.NoError(t, r.err)
	require.NotNil(t, r.a, "the held call gets the run queued while it waited")
	assert.Equal(t, id, r.a.Lease.RunID)
	assert.Less(t, time.Since(start), 10*time.Second, "the run is handed out as soon as it is queued")
	assert.LessOrEqual(t, r.a.Lease.WaitedMillis, time.Since(start).Milliseconds(), "waited_ms is within the call")
}

func testLeaseNoFreeSlot(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	start := time.Now()
	a, err := h.worker(0).AcquireLease(h.ctx, workerclient.LeaseRequest{WorkerID: "worker-0",
		Capacity: workerclient.Capacity{Slots: 2, FreeSlots: 0}, WaitMillis: 5000})
	require.NoError(t, err)
	assert.Nil(t, a, "a worker without a free slot gets no run")
	assert.Less(t, time.Since(start), 2500*time.Millisecond, "a worker without a free slot is answered at once, not held")
	assert.Equal(t, model.StatusQueued, h.cp.Run(t, id).Status)
}

func testLeaseFits(t *testing.T, h *harness) {
	big := h.cp.Submit(t, Spec{MemoryBytes: 1 << 30})
	gvisor := h.cp.Submit(t, Spec{Runtime: "runsc"})
	image := h.cp.Submit(t, Spec{Image: "example.com/agent:2"})
	plain1 := h.cp.Submit(t, Spec{})
	plain2 := h.cp.Submit(t, Spec{})
	small := workerclient.LeaseRequest{WorkerID: "small",
		Capacity: workerclient.Capacity{Slots: 4, FreeSlots: 4, FreeMemoryBytes: 256 << 20},
		Labels:   workerclient.WorkerLabels{Runtimes: []string{"runc"}, Images: []string{"example.com/agent:1"}}}
	w := h.worker(0)
	for _, want := range []string{plain1, plain2} {
		a, err := w.AcquireLease(h.ctx, small)
		require.NoError(t, err)
		require.NotNil(t, a)
		assert.Equal(t, want, a.Lease.RunID, "the oldest run that fits is handed out first")
	}
	a, err := w.AcquireLease(h.ctx, small)
	require.NoError(t, err)
	require.Nil(t, a, "runs over the worker's memory, or needing a runtime or image it lacks, are not handed out")
	for _, id := range []string{big, gvisor, image} {
		assert.Equal(t, model.StatusQueued, h.cp.Run(t, id).Status, id)
	}
	roomy := workerclient.LeaseRequest{WorkerID: "roomy", Capacity: workerclient.Capacity{Slots: 4, FreeSlots: 4},
		Labels: workerclient.WorkerLabels{Runtimes: []string{"runc", "runsc"}, CanPull: true}}
	for _, want := range []string{big, gvisor, image} {
		a, err := h.worker(1).AcquireLease(h.ctx, roomy)
		require.NoError(t, err)
		require.NotNil(t, a)
		assert.Equal(t, want, a.Lease.RunID)
	}
}

func testLeaseNeedsWorkerID(t *testing.T, h *harness) {
	h.cp.Submit(t, Spec{})
	_, err := h.worker(0).AcquireLease(h.ctx, workerclient.LeaseRequest{Capacity: capacity})
	assert.Equal(t, http.StatusBadRequest, status(err), "no worker_id: %v", err)
	_, err = h.worker(0).AcquireLease(h.ctx, workerclient.LeaseRequest{WorkerID: string(make([]byte, 257)), Capacity: capacity})
	assert.Equal(t, http.StatusBadRequest, status(err), "worker_id over 256 characters: %v", err)
	h.lease(t, 0) // the run is still there
}

func testWrongBearer(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	bad := workerclient.New(h.cp.URL(), "not-a-token-of-this-control-plane", workerclient.WithRetryPolicy(noRetry))
	_, err := bad.AcquireLease(h.ctx, workerclient.LeaseRequest{WorkerID: "w", Capacity: capacity})
	assert.Equal(t, http.StatusUnauthorized, status(err), "%v", err)
	a := h.lease(t, 0)
	_, err = bad.RenewLease(h.ctx, a.Lease)
	refused(t, err, http.StatusUnauthorized, "renew with a wrong bearer token")
	err = bad.Fenced(a.Lease).UpdateRunStatus(h.ctx, id, running())
	refused(t, err, http.StatusUnauthorized, "PATCH with a wrong bearer token")
}

func testRenew(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	ttl := h.cp.LeaseTTL()
	h.cp.Advance(t, ttl/2)
	r, err := h.worker(0).RenewLease(h.ctx, a.Lease)
	require.NoError(t, err)
	assert.False(t, r.Cancel)
	assert.Greater(t, r.ExpiresAt, a.Lease.ExpiresAt, "the renewal moves the expiry")
	assert.GreaterOrEqual(t, r.ExpiresAt, h.cp.Now().Add(ttl).UnixMilli()-1000, "the lease lasts a TTL from the renewal")
	// Past the first expiry, within the renewed one.
	h.cp.Advance(t, ttl*2/3)
	_, err = h.worker(0).RenewLease(h.ctx, a.Lease)
	require.NoError(t, err, "a renewed lease outlives its first expiry")
	st := h.cp.Run(t, id)
	assert.Equal(t, model.StatusRunning, st.Status)
	assert.Equal(t, int64(1), st.Epoch, "a renewal keeps the epoch")
}

func testRenewAfterExpiry(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	h.cp.Advance(t, h.cp.LeaseTTL()+time.Second)
	_, err := h.worker(0).RenewLease(h.ctx, a.Lease)
	refused(t, err, http.StatusPreconditionFailed, "renew after expiry")
	err = h.worker(0).Fenced(a.Lease).UpdateRunStatus(h.ctx, id, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded})
	refused(t, err, http.StatusPreconditionFailed, "terminal PATCH after expiry")
	st := h.cp.Run(t, id)
	assert.Equal(t, model.StatusFailed, st.Status, "a run whose worker is lost fails")
	assert.Equal(t, "worker lost", st.Error)
	h.none(t, 1)
}

func testRenewUnknown(t *testing.T, h *harness) {
	h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	l := a.Lease
	l.RunID = "no-such-run"
	_, err := h.worker(0).RenewLease(h.ctx, l)
	refused(t, err, http.StatusNotFound, "renew of an unknown run")
}

func testMissingFence(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	w := h.worker(0)
	noToken := a.Lease
	noToken.Token = ""
	noEpoch := a.Lease
	noEpoch.Epoch = 0
	for name, c := range map[string]*workerclient.Client{"no headers": w, "no token": w.Fenced(noToken), "no epoch": w.Fenced(noEpoch)} {
		err := c.UpdateRunStatus(h.ctx, id, running())
		refused(t, err, http.StatusPreconditionRequired, "PATCH, "+name)
		err = c.Stream().Send(h.ctx, id, workerclient.Delta{Data: []byte("x")})
		refused(t, err, http.StatusPreconditionRequired, "stream, "+name)
	}
	_, err := w.RenewLease(h.ctx, noToken)
	refused(t, err, http.StatusPreconditionRequired, "renew without the token")
	st := h.cp.Run(t, id)
	assert.Empty(t, st.Output, "a refused call changes nothing")
	_, err = w.RenewLease(h.ctx, a.Lease)
	require.NoError(t, err, "the lease is untouched")
}

func testWrongToken(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	forged := a.Lease
	forged.Token = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	c := h.worker(0).Fenced(forged)
	_, err := h.worker(0).RenewLease(h.ctx, forged)
	refused(t, err, http.StatusForbidden, "renew with another token")
	refused(t, c.UpdateRunStatus(h.ctx, id, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded}), http.StatusForbidden, "PATCH with another token")
	refused(t, c.Stream().Send(h.ctx, id, workerclient.Delta{Data: []byte("x")}), http.StatusForbidden, "stream with another token")
	st := h.cp.Run(t, id)
	assert.Equal(t, model.StatusRunning, st.Status, "a refused PATCH changes nothing")
	assert.Empty(t, st.Output, "a refused stream POST changes nothing")
}

func testOtherWorker(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	thief := h.worker(1)
	_, err := thief.RenewLease(h.ctx, a.Lease)
	refused(t, err, http.StatusForbidden, "renew with the token under another worker's credential")
	c := thief.Fenced(a.Lease)
	refused(t, c.UpdateRunStatus(h.ctx, id, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded}), http.StatusForbidden,
		"PATCH with the token under another worker's credential")
	refused(t, c.Stream().Send(h.ctx, id, workerclient.Delta{Data: []byte("x")}), http.StatusForbidden,
		"stream with the token under another worker's credential")
	assert.Equal(t, model.StatusRunning, h.cp.Run(t, id).Status)
	require.NoError(t, h.worker(0).Fenced(a.Lease).UpdateRunStatus(h.ctx, id, running()), "the holder still reports")
}

func testOtherEpoch(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	future := a.Lease
	future.Epoch++
	_, err := h.worker(0).RenewLease(h.ctx, future)
	refused(t, err, http.StatusPreconditionFailed, "renew with an epoch ahead")
	refused(t, h.worker(0).Fenced(future).UpdateRunStatus(h.ctx, id, running()), http.StatusPreconditionFailed, "PATCH with an epoch ahead")
	assert.Equal(t, int64(1), h.cp.Run(t, id).Epoch)
}

func testRequeue(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{Retryable: true})
	first := h.lease(t, 0)
	old := h.worker(0).Fenced(first.Lease)
	require.NoError(t, old.UpdateRunStatus(h.ctx, id, running()))
	require.NoError(t, old.Stream().Send(h.ctx, id, workerclient.Delta{Data: []byte("first attempt\n")}))
	h.cp.Advance(t, h.cp.LeaseTTL()+time.Second)
	st := h.cp.Run(t, id)
	assert.Equal(t, model.StatusQueued, st.Status, "a retryable run whose worker is lost is queued again")
	assert.Empty(t, st.Output, "a requeued run's output starts over")

	second := h.lease(t, 1)
	assert.Equal(t, id, second.Lease.RunID)
	assert.Equal(t, int64(2), second.Lease.Epoch, "the next lease has a higher epoch")
	assert.NotEqual(t, first.Lease.Token, second.Lease.Token, "each lease has its own token")
	refused(t, old.UpdateRunStatus(h.ctx, id, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded}), http.StatusPreconditionFailed,
		"the lost worker's PATCH")
	refused(t, old.Stream().Send(h.ctx, id, workerclient.Delta{Offset: 14, Data: []byte("more\n")}), http.StatusPreconditionFailed,
		"the lost worker's stream POST")
	_, err := h.worker(0).RenewLease(h.ctx, first.Lease)
	refused(t, err, http.StatusPreconditionFailed, "the lost worker's renewal")

	now := h.worker(1).Fenced(second.Lease)
	require.NoError(t, now.Stream().Send(h.ctx, id, workerclient.Delta{Data: []byte("second\n")}), "the new holder's stream starts at 0")
	require.NoError(t, now.Stream().End(h.ctx, id, 7))
	require.NoError(t, now.UpdateRunStatus(h.ctx, id, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded, ExitCode: ptr(0)}))
	st = h.cp.Run(t, id)
	assert.Equal(t, model.StatusSucceeded, st.Status)
	assert.Equal(t, int64(2), st.Epoch)
	assert.Equal(t, "second\n", string(st.Output))
	assert.True(t, st.StreamEnded)
}

func testMaxAttempts(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{Retryable: true})
	for attempt := int64(1); attempt <= 3; attempt++ {
		a := h.lease(t, int(attempt%2))
		require.Equal(t, attempt, a.Lease.Epoch)
		h.cp.Advance(t, h.cp.LeaseTTL()+time.Second)
	}
	st := h.cp.Run(t, id)
	assert.Equal(t, model.StatusFailed, st.Status, "a retryable run is leased at most 3 times")
	assert.Equal(t, "worker lost (3 attempts)", st.Error)
	h.none(t, 0)
}

func testPatch(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	c := h.worker(0).Fenced(a.Lease)
	p := running()
	p.Container = &workerclient.ContainerInfo{ID: "4f2a9c1e0b7d", Runtime: "runc"}
	require.NoError(t, c.UpdateRunStatus(h.ctx, id, p))
	require.NoError(t, c.UpdateRunStatus(h.ctx, id, p), "a repeated PATCH is accepted")
	assert.Equal(t, model.StatusRunning, h.cp.Run(t, id).Status)
	done := &workerclient.PatchTaskRunRequest{Status: model.StatusFailed, Error: ptr("agent exited 3"), ExitCode: ptr(3), EndedAt: ptr(int64(1767225660000))}
	require.NoError(t, c.UpdateRunStatus(h.ctx, id, done))
	require.NoError(t, c.UpdateRunStatus(h.ctx, id, done), "a repeated terminal PATCH is accepted")
	require.NoError(t, c.UpdateRunStatus(h.ctx, id, &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded}),
		"a later terminal PATCH under the same lease is accepted")
	st := h.cp.Run(t, id)
	assert.Equal(t, model.StatusFailed, st.Status, "the first terminal status wins")
	assert.Equal(t, "agent exited 3", st.Error)
	_, err := h.worker(0).RenewLease(h.ctx, a.Lease)
	refused(t, err, http.StatusPreconditionFailed, "renew after the terminal PATCH")
	require.NoError(t, c.Stream().Send(h.ctx, id, workerclient.Delta{Data: []byte("tail\n")}), "the stream's tail is accepted after the end")
	require.NoError(t, c.Stream().End(h.ctx, id, 5))
	st = h.cp.Run(t, id)
	assert.Equal(t, "tail\n", string(st.Output))
	assert.True(t, st.StreamEnded)
	h.cp.Advance(t, h.cp.LeaseTTL()+time.Second)
	assert.Equal(t, model.StatusFailed, h.cp.Run(t, id).Status, "an ended run is not lost")
	assert.Equal(t, "agent exited 3", h.cp.Run(t, id).Error)
}

func testPatchBadStatus(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	c := h.worker(0).Fenced(a.Lease)
	for _, s := range []model.RunStatus{model.StatusQueued, "", "DONE"} {
		refused(t, c.UpdateRunStatus(h.ctx, id, &workerclient.PatchTaskRunRequest{Status: s}), http.StatusBadRequest, fmt.Sprintf("PATCH status %q", s))
	}
	assert.Equal(t, model.StatusRunning, h.cp.Run(t, id).Status)
}

func testStream(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	s := h.worker(0).Fenced(a.Lease).Stream()
	send := func(off int64, data string) error {
		return s.Send(h.ctx, id, workerclient.Delta{Offset: off, Data: []byte(data)})
	}
	require.NoError(t, send(0, "hello"))
	require.NoError(t, send(0, "hello"), "a duplicate is dropped")
	require.NoError(t, send(3, "lo wo"), "an overlap appends the rest")
	require.NoError(t, send(8, "rld\n"))
	refused(t, send(20, "gap"), http.StatusConflict, "a gap")
	refused(t, send(6, "W"), http.StatusConflict, "resent bytes that differ")
	refused(t, s.End(h.ctx, id, 11), http.StatusConflict, "an end with a wrong total")
	assert.Equal(t, "hello world\n", string(h.cp.Run(t, id).Output))
	assert.False(t, h.cp.Run(t, id).StreamEnded)
	require.NoError(t, s.End(h.ctx, id, 12))
	require.NoError(t, s.End(h.ctx, id, 12), "a repeated end is harmless")
	require.NoError(t, send(6, "world\n"), "held bytes may be resent after the end")
	refused(t, send(12, "more"), http.StatusConflict, "bytes past the end")
	st := h.cp.Run(t, id)
	assert.Equal(t, "hello world\n", string(st.Output))
	assert.True(t, st.StreamEnded)
}

func testCancelLeased(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	a := h.lease(t, 0)
	r, err := h.worker(0).RenewLease(h.ctx, a.Lease)
	require.NoError(t, err)
	assert.False(t, r.Cancel)
	h.cp.Cancel(t, id)
	assert.Equal(t, model.StatusRunning, h.cp.Run(t, id).Status, "a leased run runs until its worker stops it")
	r, err = h.worker(0).RenewLease(h.ctx, a.Lease)
	require.NoError(t, err)
	assert.True(t, r.Cancel, "the renewal tells the worker to stop the run")
	require.NoError(t, h.worker(0).Fenced(a.Lease).UpdateRunStatus(h.ctx, id, &workerclient.PatchTaskRunRequest{Status: model.StatusCancelled}))
	assert.Equal(t, model.StatusCancelled, h.cp.Run(t, id).Status)
}

func testCancelQueued(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{})
	h.cp.Cancel(t, id)
	assert.Equal(t, model.StatusCancelled, h.cp.Run(t, id).Status, "a queued run is cancelled at once")
	h.none(t, 0)
}

func testCancelThenLost(t *testing.T, h *harness) {
	id := h.cp.Submit(t, Spec{Retryable: true})
	h.lease(t, 0)
	h.cp.Cancel(t, id)
	h.cp.Advance(t, h.cp.LeaseTTL()+time.Second)
	assert.Equal(t, model.StatusCancelled, h.cp.Run(t, id).Status, "a cancelled run whose worker is lost is not run again")
	h.none(t, 1)
}
