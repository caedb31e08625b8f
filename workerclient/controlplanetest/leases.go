package controlplanetest

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// The lease side of the test control plane (docs/control-plane-api.md,
// "Leasing"): runs are queued with Enqueue, handed out oldest first to the
// first lease call they fit, and fenced by an epoch that grows each time a
// run is leased. A lease that is not renewed within its TTL expires: the run
// is finalized FAILED "worker lost", or queued again when it is retryable.
// Every PATCH and stream POST for a leased run must carry the current epoch
// in workerclient.HeaderFence and the lease's token in
// workerclient.HeaderLeaseToken (428 without them), the right token (403
// otherwise), and arrive before the lease expired; otherwise it is answered
// 412 and counted (see Stale).

// Default lease timing of a ControlPlane; see SetLeaseTiming.
const (
	DefaultLeaseTTL   = 3 * time.Second
	DefaultLeaseRenew = time.Second
)

// ReasonWorkerLost is the error a run is finalized with when its lease
// expired without a terminal PATCH and the run is not retryable.
const ReasonWorkerLost = "worker lost"

// leaseState is one run known to the lease side.
type leaseState struct {
	a         workerclient.Assignment
	queued    bool
	epoch     int64
	token     string // the current lease's token
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

// CancelRun marks a run cancelled by its owner: the next renewal answers
// cancel: true.
func (cp *ControlPlane) CancelRun(runID string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if s := cp.leaseRuns[runID]; s != nil {
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
	cp.expireLocked(time.Now())
	s := cp.leaseRuns[runID]
	if s == nil {
		return LeaseInfo{}
	}
	return LeaseInfo{Epoch: s.epoch, Queued: s.queued, Status: s.status, Reason: s.reason,
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
		if s.a.Retryable {
			s.queued = true
			cp.queue = append(cp.queue, id)
			cp.wakeLocked()
			continue
		}
		s.status, s.reason = model.StatusFailed, ReasonWorkerLost
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
func (cp *ControlPlane) takeLocked(req workerclient.LeaseRequest, arrived, now time.Time) *workerclient.Assignment {
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
		s.token = rand.Text()
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
	if req.WorkerID == "" {
		http.Error(w, "lease request needs worker_id", http.StatusBadRequest)
		return
	}
	wait := time.Duration(min(max(req.WaitMillis, 0), workerclient.MaxLeaseWait.Milliseconds())) * time.Millisecond
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond) // notices expiries while waiting
	defer tick.Stop()
	arrived := time.Now()
	cp.mu.Lock()
	cp.leaseReqs = append(cp.leaseReqs, req)
	cp.mu.Unlock()
	for {
		if r.Context().Err() != nil {
			return // the worker gave up: hand it nothing it would never see
		}
		cp.mu.Lock()
		now := time.Now()
		cp.expireLocked(now)
		a := cp.takeLocked(req, arrived, now)
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
	cp.mu.Lock()
	now := time.Now()
	cp.expireLocked(now)
	s := cp.leaseRuns[id]
	if !fenceHeaders(w, r) {
		cp.mu.Unlock()
		return
	}
	if !tokenOK(r, s) {
		cp.mu.Unlock()
		http.Error(w, "not the lease's token", http.StatusForbidden)
		return
	}
	if !cp.fenceOKLocked(r, id, s) {
		cp.mu.Unlock()
		http.Error(w, "stale or expired lease", http.StatusPreconditionFailed)
		return
	}
	s.expires = now.Add(cp.ttl)
	s.renewals++
	resp := workerclient.RenewResponse{ExpiresAt: s.expires.UnixMilli(), Cancel: s.cancel}
	cp.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// fenceOKLocked checks a call for a leased run: the current epoch, a live
// lease. A refusal is counted.
func (cp *ControlPlane) fenceOKLocked(r *http.Request, id string, s *leaseState) bool {
	if s == nil {
		cp.stale[id]++
		return false
	}
	epoch, err := strconv.ParseInt(r.Header.Get(workerclient.HeaderFence), 10, 64)
	if err != nil || epoch != s.epoch || !s.leased {
		cp.stale[id]++
		return false
	}
	return true
}

// checkFence answers 412 and returns false when r is a call for a leased
// run without the run's live lease. Runs never enqueued are not fenced.
func (cp *ControlPlane) checkFence(w http.ResponseWriter, r *http.Request, id string) bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.expireLocked(time.Now())
	s := cp.leaseRuns[id]
	if s == nil {
		return true
	}
	if !fenceHeaders(w, r) {
		return false
	}
	if !tokenOK(r, s) {
		http.Error(w, "not the lease's token", http.StatusForbidden)
		return false
	}
	epoch, _ := strconv.ParseInt(r.Header.Get(workerclient.HeaderFence), 10, 64)
	if epoch > 0 && epoch == s.epoch && !s.leased && s.status.Terminal() && s.terminals > 0 {
		return true // a repeated terminal PATCH (or late stream bytes) of the holder that ended it
	}
	if !cp.fenceOKLocked(r, id, s) {
		http.Error(w, "stale or expired lease", http.StatusPreconditionFailed)
		return false
	}
	return true
}

// fenceHeaders answers 428 and returns false when r lacks the epoch or the
// lease token.
func fenceHeaders(w http.ResponseWriter, r *http.Request) bool {
	for _, h := range []string{workerclient.HeaderFence, workerclient.HeaderLeaseToken} {
		if r.Header.Get(h) == "" {
			http.Error(w, "missing "+h, http.StatusPreconditionRequired)
			return false
		}
	}
	return true
}

// tokenOK reports whether r carries the token of s's current lease, or is
// for an older epoch (which fenceOKLocked refuses as stale).
func tokenOK(r *http.Request, s *leaseState) bool {
	if s == nil {
		return true
	}
	epoch, _ := strconv.ParseInt(r.Header.Get(workerclient.HeaderFence), 10, 64)
	if epoch != s.epoch {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(r.Header.Get(workerclient.HeaderLeaseToken)), []byte(s.token)) == 1
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
