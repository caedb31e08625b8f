package controlplanetest

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// The lease side of the test control plane (docs/control-plane-api.md,
// "Leasing"), with the rules of the reference server (controlplane/server;
// workerclient/apitest runs both): runs are queued with Enqueue, handed out
// oldest first to the first lease call they fit, and fenced by an epoch that
// grows each time a run is leased. A lease that is not renewed within its
// TTL expires: the run is finalized FAILED "worker lost" (CANCELLED when its
// owner cancelled it), or queued again, its output dropped, when it is
// retryable and has had fewer than controlplane.MaxAttempts leases.
// Every renewal, PATCH and stream POST for a leased run must carry the
// current epoch in workerclient.HeaderFence and the lease's token in
// workerclient.HeaderLeaseToken (428 without them), the current epoch and a
// live lease (412 otherwise, counted: see Stale), and the lease's token with
// the worker credential it was handed to (403 otherwise). PATCHes and stream
// POSTs without fence headers for runs never enqueued are accepted: they are
// the reports of a `taskrun run --server`, which holds no lease. (The
// reference server has no such runs: it refuses them, 428.)

// Default lease timing of a ControlPlane; see SetLeaseTiming.
const (
	DefaultLeaseTTL   = 3 * time.Second
	DefaultLeaseRenew = time.Second
)

// ReasonWorkerLost is the error a run is finalized with when its lease
// expired without a terminal PATCH and the run is not retryable; a
// retryable run lost on its last attempt says "worker lost (3 attempts)".
const ReasonWorkerLost = controlplane.ErrorWorkerLost

// leaseState is one run known to the lease side.
type leaseState struct {
	a         workerclient.Assignment
	queued    bool
	epoch     int64
	token     string // the current lease's token
	holder    string // the worker credential the current lease was handed to
	expires   time.Time
	leased    bool // a live lease exists (not expired, not ended)
	status    model.RunStatus
	reason    string
	cancel    bool
	renewals  int
	holders   []string // worker IDs, one per epoch
	terminals int      // terminal PATCHes accepted
}

// Enqueue queues a run to be leased. a.Run.ID names it; a.Lease is filled
// in when the run is handed out.
func (cp *ControlPlane) Enqueue(a workerclient.Assignment) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if a.Run.Status == "" {
		a.Run.Status = model.StatusRunning
	}
	cp.leaseRuns[a.Run.ID] = &leaseState{a: a, queued: true}
	cp.queue = append(cp.queue, a.Run.ID)
	cp.wakeLocked()
}

// SetLeaseTiming sets the TTL and renewal interval of the leases handed out
// from now on.
func (cp *ControlPlane) SetLeaseTiming(ttl, renew time.Duration) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.ttl, cp.renew = ttl, renew
}

// CancelRun cancels a run for its owner: a queued run ends CANCELLED at
// once; for a leased one the next renewal answers cancel: true. An ended
// run is left as it is.
func (cp *ControlPlane) CancelRun(runID string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.expireLocked(cp.nowLocked())
	s := cp.leaseRuns[runID]
	switch {
	case s == nil || s.status.Terminal():
	case s.queued:
		s.queued = false
		cp.queue = slices.DeleteFunc(cp.queue, func(id string) bool { return id == runID })
		s.status, s.reason = model.StatusCancelled, "cancelled before a worker took it"
	default:
		s.cancel = true
	}
}

// RevokeLease makes runID's current lease stale at once, as if another
// worker had taken the run over: the epoch grows and every call with the
// old one is answered 412.
func (cp *ControlPlane) RevokeLease(runID string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if s := cp.leaseRuns[runID]; s != nil {
		s.epoch++
		s.leased = false
	}
}

// LeaseInfo is what the lease side knows of one run.
type LeaseInfo struct {
	// Epoch is the run's current epoch (0: never leased).
	Epoch int64
	// Current is the run's status now: QUEUED, RUNNING or its final status.
	Current model.RunStatus
	// Queued is set while the run waits for a worker.
	Queued bool
	// Status and Reason are the run's final status, once it has one (from
	// a terminal PATCH, or "worker lost" after its lease expired).
	Status model.RunStatus
	Reason string
	// Renewals counts the accepted renewals.
	Renewals int
	// Holders are the worker IDs the run was leased to, in order.
	Holders []string
	// Terminals counts the terminal PATCHes accepted.
	Terminals int
}

// Lease returns what the lease side knows of runID.
func (cp *ControlPlane) Lease(runID string) LeaseInfo {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.expireLocked(cp.nowLocked())
	s := cp.leaseRuns[runID]
	if s == nil {
		return LeaseInfo{}
	}
	cur := s.status
	switch {
	case cur != "":
	case s.queued:
		cur = model.StatusQueued
	default:
		cur = model.StatusRunning
	}
	return LeaseInfo{Epoch: s.epoch, Queued: s.queued, Current: cur, Status: s.status, Reason: s.reason,
		Renewals: s.renewals, Holders: slices.Clone(s.holders), Terminals: s.terminals}
}

// LeaseRequests returns the bodies of every lease call received, in order.
func (cp *ControlPlane) LeaseRequests() []workerclient.LeaseRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return slices.Clone(cp.leaseReqs)
}

// Stale returns how many calls for runID were refused with 412 (a stale or
// missing fencing token, or an expired lease).
func (cp *ControlPlane) Stale(runID string) int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.stale[runID]
}

// wakeLocked wakes every waiting lease call.
func (cp *ControlPlane) wakeLocked() {
	close(cp.wake)
	cp.wake = make(chan struct{})
}

// expireLocked finalizes or requeues runs whose lease expired.
func (cp *ControlPlane) expireLocked(now time.Time) {
	for id, s := range cp.leaseRuns {
		if !s.leased || now.Before(s.expires) {
			continue
		}
		s.leased = false
		attempts := len(s.holders)
		switch {
		case s.cancel:
			s.status, s.reason = model.StatusCancelled, "cancelled; "+ReasonWorkerLost
		case s.a.Retryable && attempts < controlplane.MaxAttempts:
			s.queued = true
			cp.queue = append(cp.queue, id)
			delete(cp.streams, id) // the next attempt's output starts over
			cp.wakeLocked()
		case s.a.Retryable:
			s.status, s.reason = model.StatusFailed, fmt.Sprintf("%s (%d attempts)", ReasonWorkerLost, attempts)
		default:
			s.status, s.reason = model.StatusFailed, ReasonWorkerLost
		}
	}
}

// fits reports whether the run fits what the worker said it can place.
func fits(a workerclient.Assignment, req workerclient.LeaseRequest) bool {
	c, l := req.Capacity, req.Labels
	if c.FreeSlots <= 0 {
		return false
	}
	if a.Limits.MemoryBytes > 0 && c.FreeMemoryBytes > 0 && a.Limits.MemoryBytes > c.FreeMemoryBytes {
		return false
	}
	if a.Limits.DiskBytes > 0 && c.FreeDiskBytes > 0 && a.Limits.DiskBytes > c.FreeDiskBytes {
		return false
	}
	if a.Runtime != "" && !slices.Contains(l.Runtimes, a.Runtime) {
		return false
	}
	if a.Image != "" && !l.CanPull && !slices.Contains(l.Images, a.Image) {
		return false
	}
	return true
}

// takeLocked hands out the oldest queued run that fits req, or nil.
func (cp *ControlPlane) takeLocked(req workerclient.LeaseRequest, holder string, arrived, now time.Time) *workerclient.Assignment {
	for i, id := range cp.queue {
		s := cp.leaseRuns[id]
		if !fits(s.a, req) {
			continue
		}
		cp.queue = slices.Delete(cp.queue, i, i+1)
		s.queued, s.leased = false, true
		s.epoch++
		s.expires = now.Add(cp.ttl)
		s.holders = append(s.holders, req.WorkerID)
		s.token, s.holder, s.cancel = rand.Text(), holder, false
		a := s.a
		a.Lease = workerclient.Lease{RunID: id, Epoch: s.epoch, Token: s.token, ExpiresAt: s.expires.UnixMilli(),
			TTLMillis: cp.ttl.Milliseconds(), RenewMillis: cp.renew.Milliseconds(), WaitedMillis: now.Sub(arrived).Milliseconds()}
		return &a
	}
	return nil
}

func (cp *ControlPlane) handleLease(w http.ResponseWriter, r *http.Request) {
	var req workerclient.LeaseRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		http.Error(w, "bad lease request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if req.WorkerID == "" || len(req.WorkerID) > 256 {
		http.Error(w, "lease request: worker_id must be 1 to 256 characters", http.StatusBadRequest)
		return
	}
	wait := time.Duration(min(max(req.WaitMillis, 0), workerclient.MaxLeaseWait.Milliseconds())) * time.Millisecond
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond) // notices expiries while waiting
	defer tick.Stop()
	cp.mu.Lock()
	arrived := cp.nowLocked()
	cp.leaseReqs = append(cp.leaseReqs, req)
	cp.mu.Unlock()
	if req.Capacity.FreeSlots <= 0 {
		w.WriteHeader(http.StatusNoContent) // nothing fits: no need to hold the call
		return
	}
	for {
		if r.Context().Err() != nil {
			return // the worker gave up: hand it nothing it would never see
		}
		cp.mu.Lock()
		now := cp.nowLocked()
		cp.expireLocked(now)
		a := cp.takeLocked(req, credential(r), arrived, now)
		wake := cp.wake
		cp.mu.Unlock()
		if a != nil {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(a)
			return
		}
		select {
		case <-wake:
		case <-tick.C:
		case <-deadline.C:
			w.WriteHeader(http.StatusNoContent)
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (cp *ControlPlane) handleRenew(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := workerclient.ValidateTaskRunID(id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cp.mu.Lock()
	now := cp.nowLocked()
	cp.expireLocked(now)
	s := cp.leaseRuns[id]
	if !cp.fenceLocked(w, r, id, s, false) {
		cp.mu.Unlock()
		return
	}
	s.expires = now.Add(cp.ttl)
	s.renewals++
	resp := workerclient.RenewResponse{ExpiresAt: s.expires.UnixMilli(), Cancel: s.cancel}
	cp.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// checkFence answers the request and returns false when r is a call for a
// run that its fence does not speak for (see fenceLocked). A call without
// fence headers for a run never enqueued is let through unfenced.
func (cp *ControlPlane) checkFence(w http.ResponseWriter, r *http.Request, id string) bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.expireLocked(cp.nowLocked())
	s := cp.leaseRuns[id]
	if s == nil && r.Header.Get(workerclient.HeaderFence) == "" && r.Header.Get(workerclient.HeaderLeaseToken) == "" {
		return true
	}
	return cp.fenceLocked(w, r, id, s, true)
}

// fenceLocked checks a call for run id (s, nil when unknown) in the order
// the reference server does: both fence headers (428) and a positive epoch
// (400), a known run (404), the current epoch and a live lease (412,
// counted), the lease's token and the worker credential it was handed to
// (403). When allowReleased, a lease its holder ended with a terminal PATCH
// still passes (a repeated terminal PATCH, the stream's tail). It answers a
// refusal itself.
func (cp *ControlPlane) fenceLocked(w http.ResponseWriter, r *http.Request, id string, s *leaseState, allowReleased bool) bool {
	v, tok := r.Header.Get(workerclient.HeaderFence), r.Header.Get(workerclient.HeaderLeaseToken)
	for _, h := range []struct{ name, got string }{{workerclient.HeaderFence, v}, {workerclient.HeaderLeaseToken, tok}} {
		if h.got == "" {
			http.Error(w, "missing "+h.name, http.StatusPreconditionRequired)
			return false
		}
	}
	epoch, err := strconv.ParseInt(v, 10, 64)
	if err != nil || epoch <= 0 {
		http.Error(w, workerclient.HeaderFence+" must be a positive integer", http.StatusBadRequest)
		return false
	}
	if s == nil {
		http.Error(w, "no such run", http.StatusNotFound)
		return false
	}
	released := allowReleased && !s.leased && s.terminals > 0 && s.status.Terminal()
	switch {
	case epoch != s.epoch || (!s.leased && !released):
		cp.stale[id]++
		http.Error(w, "stale or expired lease", http.StatusPreconditionFailed)
		return false
	case subtle.ConstantTimeCompare([]byte(tok), []byte(s.token)) != 1 || credential(r) != s.holder:
		http.Error(w, "not the holder of the run's lease", http.StatusForbidden)
		return false
	}
	return true
}

// endLeaseLocked records a terminal PATCH for a leased run: the first
// terminal status wins and the lease ends.
func (cp *ControlPlane) endLeaseLocked(id string, req workerclient.PatchTaskRunRequest) {
	s := cp.leaseRuns[id]
	if s == nil || !req.Status.Terminal() {
		return
	}
	s.terminals++
	if s.status == "" {
		s.status = req.Status
		if req.Error != nil {
			s.reason = *req.Error
		}
	}
	s.leased = false
}
