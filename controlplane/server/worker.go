package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
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

// maxJSONBody caps a worker's JSON bodies (a PATCH stays under 1 MiB).
const maxJSONBody = 1 << 20

func (s *Server) handleLease(w http.ResponseWriter, r *http.Request) {
	arrived := s.cfg.Now()
	var req workerclient.LeaseRequest
	lift := readDeadline(w, bodyDeadline)
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req)
	lift()
	if err != nil {
		writeError(w, http.StatusBadRequest, "lease request: "+err.Error())
		return
	}
	if req.WorkerID == "" || len(req.WorkerID) > 256 {
		writeError(w, http.StatusBadRequest, "lease request: worker_id must be 1 to 256 characters")
		return
	}
	s.recordWorker(r, req)
	s.live.set(req.WorkerID, req.Live)
	if req.Capacity.FreeSlots <= 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	wait := time.Duration(min(max(req.WaitMillis, 0), workerclient.MaxLeaseWait.Milliseconds())) * time.Millisecond
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	fits := fitter(req)
	holder := workerFromContext(r.Context())
	for {
		woken := s.runs.wait(queueKey)
		token, hash, err := newLeaseToken()
		if err != nil {
			s.storeError(w, r, err)
			return
		}
		now := s.cfg.Now()
		run, err := s.cfg.Store.Lease(r.Context(), controlplane.LeaseOffer{WorkerID: req.WorkerID, Holder: holder, TokenHash: hash,
			Now: now, TTL: s.cfg.LeaseTTL, Fits: fits})
		if err != nil {
			s.storeError(w, r, err)
			return
		}
		if run != nil {
			if r.Context().Err() != nil {
				// The worker stopped waiting (it is draining, or gone): the
				// answer cannot be delivered, so the run goes back.
				s.returnLease(r, *run)
				return
			}
			s.m.leasesGranted.Inc()
			s.m.queueWait.Observe(max(now.Sub(run.CreatedAt), 0).Seconds())
			s.cfg.Log.Info("lease granted", "run", run.ID, "worker", req.WorkerID, "holder", holder, "epoch", run.Epoch)
			writeJSON(w, http.StatusOK, s.assignment(*run, token, max(now.Sub(arrived), 0)))
			return
		}
		poll := time.NewTimer(s.cfg.PollInterval)
		select {
		case <-r.Context().Done():
			poll.Stop()
			return
		case <-deadline.C:
			poll.Stop()
			w.WriteHeader(http.StatusNoContent)
			return
		case <-woken:
		case <-poll.C:
		}
		poll.Stop()
	}
}

// recordWorker keeps the worker's lease request as its heartbeat. A failure
// is only logged: the worker still gets its answer.
func (s *Server) recordWorker(r *http.Request, req workerclient.LeaseRequest) {
	err := s.cfg.Store.RecordWorker(r.Context(), controlplane.Worker{ID: req.WorkerID, Capacity: req.Capacity, Labels: req.Labels, LastSeen: s.cfg.Now()})
	if err != nil && r.Context().Err() == nil {
		s.cfg.Log.Warn("record a worker's heartbeat", "worker", req.WorkerID, "err", err)
	}
}

// returnLease puts back a run leased to a long poll whose client is gone,
// so that it is not lost to "worker lost" once the lease expires.
func (s *Server) returnLease(r *http.Request, run controlplane.Run) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), returnLeaseTimeout)
	defer cancel()
	back, err := s.cfg.Store.ReturnLease(ctx, run.ID, run.Epoch, s.cfg.Now())
	switch {
	case err != nil:
		s.cfg.Log.Warn("return an undelivered lease; it will expire instead", "run", run.ID, "epoch", run.Epoch, "err", err)
	case back:
		s.m.leasesReturned.Inc()
		s.cfg.Log.Info("lease returned: the worker stopped waiting before it was delivered", "run", run.ID, "epoch", run.Epoch)
		s.runs.notify(queueKey)
	}
}

// returnLeaseTimeout bounds putting back an undelivered lease.
const returnLeaseTimeout = 10 * time.Second

// fitter reports whether a run fits the asking worker: its memory and disk
// limits within what the worker has free, its runtime among the worker's,
// its image among the worker's unless the worker may pull.
func fitter(req workerclient.LeaseRequest) func(controlplane.Run) bool {
	c, l := req.Capacity, req.Labels
	return func(r controlplane.Run) bool {
		lim := r.Spec.Limits
		switch {
		case c.FreeMemoryBytes > 0 && lim.MemoryBytes > c.FreeMemoryBytes:
			return false
		case c.FreeDiskBytes > 0 && lim.DiskBytes > c.FreeDiskBytes:
			return false
		case r.Spec.Runtime != "" && !slices.Contains(l.Runtimes, r.Spec.Runtime):
			return false
		case r.Spec.Image != "" && !l.CanPull && !slices.Contains(l.Images, r.Spec.Image):
			return false
		}
		return true
	}
}

// leaseTokenBytes is the lease token's length: 256 random bits.
const leaseTokenBytes = 32

// newLeaseToken returns a fresh lease token (crypto/rand, base64url) and
// its SHA-256, the only form the store keeps.
func newLeaseToken() (string, [32]byte, error) {
	b := make([]byte, leaseTokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", [32]byte{}, fmt.Errorf("lease token: %w", err)
	}
	tok := base64.RawURLEncoding.EncodeToString(b)
	return tok, sha256.Sum256([]byte(tok)), nil
}

// assignment answers a lease call held for waited before r was leased.
func (s *Server) assignment(r controlplane.Run, token string, waited time.Duration) workerclient.Assignment {
	ttl := s.cfg.LeaseTTL
	return workerclient.Assignment{
		Lease: workerclient.Lease{RunID: r.ID, Epoch: r.Epoch, Token: token, ExpiresAt: r.LeaseExpiresAt.UnixMilli(),
			TTLMillis: ttl.Milliseconds(), RenewMillis: (ttl / 3).Milliseconds(), WaitedMillis: waited.Milliseconds()},
		Task:      r.Task,
		Run:       model.TaskRun{ID: r.ID, TaskID: r.Task.ID, PreviousRunID: r.PreviousRunID, ParentRunID: r.ParentRunID, Status: r.Status},
		SessionID: r.SessionID,
		Workspace: r.Spec.Workspace,
		Model:     r.Spec.Model,
		Image:     r.Spec.Image,
		Runtime:   r.Spec.Runtime,
		Command:   r.Spec.Command,
		Env:       r.Spec.Env,
		Limits:    r.Spec.Limits,
		Egress:    r.Spec.Egress,
		Retryable: r.Spec.Retryable,
		KeepAlive: r.Spec.KeepAlive, IdleTimeoutMillis: r.Spec.IdleTimeoutMillis, Ports: r.Spec.Ports,
		Resume: r.Resume,
	}
}

// fence reads HeaderFence and HeaderLeaseToken, and the worker the request
// authenticated as; it answers the request itself when a header is missing
// (428) or malformed (400).
func fence(w http.ResponseWriter, r *http.Request) (controlplane.Fence, bool) {
	v, tok := r.Header.Get(workerclient.HeaderFence), r.Header.Get(workerclient.HeaderLeaseToken)
	switch {
	case v == "":
		writeError(w, http.StatusPreconditionRequired, "missing "+workerclient.HeaderFence+": send the lease's epoch")
		return controlplane.Fence{}, false
	case tok == "":
		writeError(w, http.StatusPreconditionRequired, "missing "+workerclient.HeaderLeaseToken+": send the lease's token")
		return controlplane.Fence{}, false
	}
	e, err := strconv.ParseInt(v, 10, 64)
	if err != nil || e <= 0 {
		writeError(w, http.StatusBadRequest, workerclient.HeaderFence+" must be a positive integer")
		return controlplane.Fence{}, false
	}
	if len(tok) > 256 {
		writeError(w, http.StatusBadRequest, workerclient.HeaderLeaseToken+" is longer than any lease token")
		return controlplane.Fence{}, false
	}
	return controlplane.Fence{Epoch: e, TokenHash: sha256.Sum256([]byte(tok)), Holder: workerFromContext(r.Context())}, true
}

// runID reads and checks the {id} path value.
func runID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if err := model.ValidateID("run", id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", false
	}
	return id, true
}

func (s *Server) refusedStale(err error, endpoint string) {
	switch {
	case errors.Is(err, controlplane.ErrStaleFence):
		s.m.staleFence.WithLabelValues(endpoint).Inc()
	case errors.Is(err, controlplane.ErrNotHolder):
		s.m.notHolder.WithLabelValues(endpoint).Inc()
	}
}

func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request) {
	id, ok := runID(w, r)
	if !ok {
		return
	}
	f, ok := fence(w, r)
	if !ok {
		return
	}
	run, err := s.cfg.Store.Renew(r.Context(), id, f, s.cfg.Now(), s.cfg.LeaseTTL)
	if err != nil {
		s.refusedStale(err, "renew")
		s.storeError(w, r, err)
		return
	}
	s.m.renewals.Inc()
	writeJSON(w, http.StatusOK, workerclient.RenewResponse{ExpiresAt: run.LeaseExpiresAt.UnixMilli(), Cancel: run.CancelRequested})
}

func (s *Server) handlePatch(w http.ResponseWriter, r *http.Request) {
	id, ok := runID(w, r)
	if !ok {
		return
	}
	f, ok := fence(w, r)
	if !ok {
		return
	}
	var p workerclient.PatchTaskRunRequest
	lift := readDeadline(w, bodyDeadline)
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody)).Decode(&p)
	lift()
	if err != nil {
		s.badBody(w, fmt.Errorf("PATCH body: %w", err), "PATCH body over 1 MiB")
		return
	}
	if p.Status != model.StatusRunning && p.Status != model.StatusPaused && !p.Status.Terminal() {
		writeError(w, http.StatusBadRequest, "status must be RUNNING, PAUSED, SUCCEEDED, FAILED or CANCELLED")
		return
	}
	run, changed, err := s.cfg.Store.Patch(r.Context(), id, f, s.cfg.Now(), p)
	if err != nil {
		s.refusedStale(err, "patch")
		s.storeError(w, r, err)
		return
	}
	if changed && run.Status.Terminal() {
		s.m.tokens.WithLabelValues("prompt").Add(float64(run.PromptTokens))
		s.m.tokens.WithLabelValues("completion").Add(float64(run.CompletionTokens))
		s.cfg.Log.Info("run finished", "run", id, "status", run.Status, "epoch", f.Epoch)
	}
	if changed {
		s.runs.notify(id)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleStream(w http.ResponseWriter, r *http.Request) {
	id, ok := runID(w, r)
	if !ok {
		return
	}
	f, ok := fence(w, r)
	if !ok {
		return
	}
	var (
		next int64
		err  error
	)
	if r.Header.Get(workerclient.HeaderEnd) == "true" {
		total, perr := strconv.ParseInt(r.Header.Get(workerclient.HeaderTotal), 10, 64)
		if perr != nil || total < 0 {
			writeError(w, http.StatusBadRequest, workerclient.HeaderTotal+" must be the stream's length")
			return
		}
		next, err = s.cfg.Store.EndOutput(r.Context(), id, f, s.cfg.Now(), total)
	} else {
		off, perr := strconv.ParseInt(r.Header.Get(workerclient.HeaderOffset), 10, 64)
		if perr != nil || off < 0 {
			writeError(w, http.StatusBadRequest, workerclient.HeaderOffset+" must be a byte offset")
			return
		}
		lift := readDeadline(w, bodyDeadline)
		buf, rerr := io.ReadAll(http.MaxBytesReader(w, r.Body, workerclient.MaxPostBytes))
		lift()
		if rerr != nil {
			s.badBody(w, fmt.Errorf("stream body: %w", rerr), "stream body over 1 MiB")
			return
		}
		var before controlplane.Run
		before, err = s.cfg.Store.GetRun(r.Context(), id)
		if err == nil {
			next, err = s.cfg.Store.AppendOutput(r.Context(), id, f, s.cfg.Now(), off, buf, s.cfg.Limits.MaxOutputBytes)
			if err == nil && next > before.StreamNext {
				s.m.bytesReceived.Add(float64(next - before.StreamNext))
			}
		}
	}
	if err != nil {
		s.refusedStale(err, "stream")
		if errors.Is(err, controlplane.ErrConflict) {
			if run, gerr := s.cfg.Store.GetRun(r.Context(), id); gerr == nil {
				w.Header().Set(workerclient.HeaderNext, strconv.FormatInt(run.StreamNext, 10))
			}
		}
		s.storeError(w, r, err)
		return
	}
	s.runs.notify(id)
	w.Header().Set(workerclient.HeaderNext, strconv.FormatInt(next, 10))
	w.WriteHeader(http.StatusNoContent)
}
