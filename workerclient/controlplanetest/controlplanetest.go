// Package controlplanetest is a real HTTP control plane for tests: it serves
// the endpoints the worker speaks on a loopback port (PATCH, stream, and the
// lease endpoints with epochs, long polls and expiry: see leases.go), records every PATCH,
// reassembles streams by offset (dropping duplicates, failing the test on gaps
// or on overlaps whose bytes differ), checks the bearer token, and injects
// faults on demand: error statuses, 429 with Retry-After, connection resets,
// delays and stalls, and restarts on the same address.
package controlplanetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// Endpoint selects which requests a Fault applies to.
type Endpoint int

// The endpoints a fault can target.
const (
	// AnyEndpoint matches every request.
	AnyEndpoint Endpoint = iota
	// PatchEndpoint matches PATCH /v1/task-runs/{id}.
	PatchEndpoint
	// StreamEndpoint matches POST /v1/task-runs/{id}/stream.
	StreamEndpoint
	// LeaseEndpoint matches POST /v1/leases.
	LeaseEndpoint
	// RenewEndpoint matches POST /v1/leases/{id}/renew.
	RenewEndpoint
)

// Fault is one injected failure, consumed by the first matching request. A
// Fault with no effect set lets one matching request through untouched, which
// places the faults queued after it later in a stream.
type Fault struct {
	// Endpoint selects the requests the fault applies to.
	Endpoint Endpoint
	// Hold, when non-nil, holds the request until it is closed: a server
	// stalled for as long as the test wants. Like Delay, a request whose client
	// gave up meanwhile is dropped.
	Hold <-chan struct{}
	// Delay holds the request this long before anything else (a slow server or,
	// longer than the client's attempt timeout, a stall). A request whose client
	// gave up meanwhile is dropped unprocessed. With Restart it is the downtime.
	Delay time.Duration
	// Status, when non-zero, is answered instead of handling the request.
	Status int
	// RetryAfter is sent as the Retry-After header with Status.
	RetryAfter string
	// Reset drops the connection (TCP RST) without an answer.
	Reset bool
	// Restart closes the server, with every open connection, and listens again
	// on the same address after Delay.
	Restart bool
	// AfterCommit handles the request first and then fails only the answer, as
	// when a response is lost: the client retries what the server already has.
	AfterCommit bool
}

// Repeat returns n copies of f, for InjectFaults.
func Repeat(n int, f Fault) []Fault {
	fs := make([]Fault, n)
	for i := range fs {
		fs[i] = f
	}
	return fs
}

// Request is the record of one request the control plane received.
type Request struct {
	// Time is when the request arrived.
	Time time.Time
	// Method and RunID identify the request.
	Method, RunID string
	// Endpoint is PatchEndpoint or StreamEndpoint.
	Endpoint Endpoint
	// Fence is the request's fencing token (0: none).
	Fence int64
	// Offset and Len describe a stream POST's body; End marks the end POST.
	Offset int64
	Len    int
	End    bool
	// Fault is the fault applied to it, if any.
	Fault *Fault
}

// stream is a reassembled run output.
type stream struct {
	data  []byte
	ended bool
	total int64
}

// ControlPlane is the test server. Create it with New.
type ControlPlane struct {
	tb testing.TB

	mu         sync.Mutex
	addr       string
	srv        *http.Server
	serveDone  chan struct{}
	faults     []Fault
	requests   []Request
	patches    map[string][]workerclient.PatchTaskRunRequest
	streams    map[string]*stream
	violations []error
	authFails  int
	// workers maps each worker credential (bearer token) to its name; a
	// lease is bound to the credential that asked for it.
	workers map[string]string
	// skew moves the lease clock ahead of time.Now (see Advance).
	skew time.Duration

	// The lease side (leases.go).
	leaseRuns  map[string]*leaseState
	queue      []string
	wake       chan struct{}
	ttl, renew time.Duration
	leaseReqs  []workerclient.LeaseRequest
	stale      map[string]int
}

// New starts a control plane on a loopback port that accepts token as bearer
// token. It stops, and fails tb on any unclaimed protocol violation, at cleanup.
func New(tb testing.TB, token string) *ControlPlane {
	tb.Helper()
	cp := &ControlPlane{
		tb:      tb,
		workers: map[string]string{token: "default"},
		patches: map[string][]workerclient.PatchTaskRunRequest{},
		streams: map[string]*stream{},

		leaseRuns: map[string]*leaseState{},
		wake:      make(chan struct{}),
		ttl:       DefaultLeaseTTL,
		renew:     DefaultLeaseRenew,
		stale:     map[string]int{},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("controlplanetest: listen: %v", err)
	}
	cp.addr = l.Addr().String()
	cp.serve(l)
	tb.Cleanup(func() {
		cp.stop()
		for _, v := range cp.Violations() {
			tb.Errorf("controlplanetest: protocol violation: %v", v)
		}
	})
	return cp
}

// URL returns the base URL to give workerclient.New.
func (cp *ControlPlane) URL() string { return "http://" + cp.addr }

// InjectFaults queues faults; each is consumed, in order, by the next request
// its Endpoint matches.
func (cp *ControlPlane) InjectFaults(faults ...Fault) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.faults = append(cp.faults, faults...)
}

// PendingFaults returns how many injected faults no request has consumed yet.
func (cp *ControlPlane) PendingFaults() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return len(cp.faults)
}

// Patches returns the PATCH bodies applied for runID, in arrival order.
func (cp *ControlPlane) Patches(runID string) []workerclient.PatchTaskRunRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]workerclient.PatchTaskRunRequest(nil), cp.patches[runID]...)
}

// Stream returns runID's reassembled output, whether its end marker arrived,
// and the total the end marker carried.
func (cp *ControlPlane) Stream(runID string) (data []byte, ended bool, total int64) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	s := cp.streams[runID]
	if s == nil {
		return nil, false, 0
	}
	return bytes.Clone(s.data), s.ended, s.total
}

// Requests returns every request received for runID (faulted ones included),
// in arrival order.
func (cp *ControlPlane) Requests(runID string) []Request {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var out []Request
	for _, r := range cp.requests {
		if r.RunID == runID {
			out = append(out, r)
		}
	}
	return out
}

// AuthFailures returns how many requests were refused for a bad bearer token.
func (cp *ControlPlane) AuthFailures() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.authFails
}

// Violations returns the protocol violations seen so far (stream gaps, overlaps
// with different bytes, bad totals) and clears them, so a test that provokes
// one on purpose can claim it.
func (cp *ControlPlane) Violations() []error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	v := cp.violations
	cp.violations = nil
	return v
}

// Restart closes the server with all its connections and listens again on the
// same address after downtime.
func (cp *ControlPlane) Restart(downtime time.Duration) {
	cp.stop()
	if downtime > 0 {
		time.Sleep(downtime)
	}
	var l net.Listener
	var err error
	for range 50 {
		if l, err = net.Listen("tcp", cp.addr); !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		cp.tb.Errorf("controlplanetest: listen again on %s: %v", cp.addr, err)
		return
	}
	cp.serve(l)
}

func (cp *ControlPlane) serve(l net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("PATCH /v1/task-runs/{id}", cp.handlePatch)
	mux.HandleFunc("POST /v1/task-runs/{id}/stream", cp.handleStream)
	mux.HandleFunc("POST /v1/leases", cp.handleLease)
	mux.HandleFunc("POST /v1/leases/{id}/renew", cp.handleRenew)
	srv := &http.Server{Handler: cp.middleware(mux), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	cp.mu.Lock()
	cp.srv, cp.serveDone = srv, done
	cp.mu.Unlock()
	go func() {
		defer close(done)
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			cp.tb.Errorf("controlplanetest: serve: %v", err)
		}
	}()
}

func (cp *ControlPlane) stop() {
	cp.mu.Lock()
	srv, done := cp.srv, cp.serveDone
	cp.mu.Unlock()
	_ = srv.Close()
	<-done
}

// middleware records the request, applies a pending fault and checks auth.
func (cp *ControlPlane) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := recordOf(r)
		fault := cp.takeFault(rec.Endpoint)
		rec.Fault = fault
		cp.mu.Lock()
		cp.requests = append(cp.requests, rec)
		cp.mu.Unlock()

		if fault != nil && fault.Restart {
			cp.Restart(fault.Delay)
			return
		}
		if fault != nil && fault.AfterCommit {
			cp.commitThenFail(w, r, next, *fault)
			return
		}
		if fault != nil && !hold(r.Context(), *fault) {
			return // the client gave up; drop the request unprocessed
		}
		if fault != nil && (fault.Reset || fault.Status != 0) {
			failAnswer(w, *fault)
			return
		}
		r, ok := cp.authorized(w, r)
		if !ok {
			return
		}
		next.ServeHTTP(w, r)
	})
}

// AddWorkerToken accepts token as the credential of one more worker. A
// lease is bound to the credential that asked for it: a call for the run
// made with another worker's credential is refused (403), even with the
// lease's token.
func (cp *ControlPlane) AddWorkerToken(token string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.workers[token] = fmt.Sprintf("worker-%d", len(cp.workers))
}

// Now is the lease side's clock: time.Now moved ahead by Advance.
func (cp *ControlPlane) Now() time.Time {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.nowLocked()
}

func (cp *ControlPlane) nowLocked() time.Time { return time.Now().Add(cp.skew) }

// Advance moves the lease side's clock forward by d: leases lapse as if d
// had passed.
func (cp *ControlPlane) Advance(d time.Duration) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.skew += d
}

// credentialKey is the context key of the worker credential a request
// authenticated with.
type credentialKey struct{}

// credential returns the name of the worker credential r authenticated with.
func credential(r *http.Request) string {
	name, _ := r.Context().Value(credentialKey{}).(string)
	return name
}

// authorized checks the bearer token, answering 401 when it is wrong, and
// returns r with the worker credential's name in its context.
func (cp *ControlPlane) authorized(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if name, known := cp.workers[tok]; ok && known {
		return r.WithContext(context.WithValue(r.Context(), credentialKey{}, name)), true
	}
	cp.authFails++
	http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
	return r, false
}

// commitThenFail handles r for real, then applies the fault to the answer
// only: the answer is delayed or held, replaced by an error status or lost in
// a connection reset.
func (cp *ControlPlane) commitThenFail(w http.ResponseWriter, r *http.Request, next http.Handler, f Fault) {
	rec := httptest.NewRecorder()
	if r, ok := cp.authorized(rec, r); ok {
		next.ServeHTTP(rec, r)
	}
	if !hold(r.Context(), f) {
		return // the client gave up; its answer is lost
	}
	if f.Reset || f.Status != 0 {
		failAnswer(w, f)
		return
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// recordOf describes r. The mux has not routed r yet, so the run ID is taken
// from the path directly.
func recordOf(r *http.Request) Request {
	fence, _ := strconv.ParseInt(r.Header.Get(workerclient.HeaderFence), 10, 64)
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/leases"); ok {
		id, _ := strings.CutSuffix(strings.TrimPrefix(rest, "/"), "/renew")
		rec := Request{Time: time.Now(), Method: r.Method, RunID: id, Endpoint: RenewEndpoint, Fence: fence}
		if id == "" {
			rec.Endpoint = LeaseEndpoint
		}
		return rec
	}
	id, _ := strings.CutPrefix(r.URL.Path, "/v1/task-runs/")
	id, isStream := strings.CutSuffix(id, "/stream")
	rec := Request{Time: time.Now(), Method: r.Method, RunID: id, Endpoint: PatchEndpoint, Fence: fence}
	if isStream {
		rec.Endpoint = StreamEndpoint
		rec.Offset, _ = strconv.ParseInt(r.Header.Get(workerclient.HeaderOffset), 10, 64)
		rec.Len = int(r.ContentLength)
		rec.End = r.Header.Get(workerclient.HeaderEnd) == "true"
	}
	return rec
}

func (cp *ControlPlane) takeFault(e Endpoint) *Fault {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for i, f := range cp.faults {
		if f.Endpoint == AnyEndpoint || f.Endpoint == e {
			cp.faults = append(cp.faults[:i], cp.faults[i+1:]...)
			return &f
		}
	}
	return nil
}

// failAnswer answers with the fault's status or resets the connection.
func failAnswer(w http.ResponseWriter, f Fault) {
	if f.Reset {
		resetConn(w)
		return
	}
	if f.RetryAfter != "" {
		w.Header().Set("Retry-After", f.RetryAfter)
	}
	http.Error(w, "injected fault", f.Status)
}

// resetConn closes the connection with an RST instead of an answer.
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(fmt.Sprintf("controlplanetest: hijack for reset: %v", err))
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// hold applies the fault's Delay and Hold; it reports false if ctx ended first.
func hold(ctx context.Context, f Fault) bool {
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
	if f.Hold != nil {
		select {
		case <-f.Hold:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

func (cp *ControlPlane) handlePatch(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := workerclient.ValidateTaskRunID(id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "Content-Type must be application/json", http.StatusUnsupportedMediaType)
		return
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	var req workerclient.PatchTaskRunRequest
	if err := dec.Decode(&req); err != nil {
		http.Error(w, "bad PATCH body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if req.Status != model.StatusRunning && !req.Status.Terminal() {
		http.Error(w, "status must be RUNNING, SUCCEEDED, FAILED or CANCELLED", http.StatusBadRequest)
		return
	}
	if !cp.checkFence(w, r, id) {
		return
	}
	cp.mu.Lock()
	cp.patches[id] = append(cp.patches[id], req)
	cp.endLeaseLocked(id, req)
	cp.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (cp *ControlPlane) handleStream(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := workerclient.ValidateTaskRunID(id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !cp.checkFence(w, r, id) {
		return
	}
	if r.Header.Get(workerclient.HeaderEnd) == "true" {
		total, err := strconv.ParseInt(r.Header.Get(workerclient.HeaderTotal), 10, 64)
		if err != nil || total < 0 {
			http.Error(w, "end marker needs a non-negative "+workerclient.HeaderTotal, http.StatusBadRequest)
			return
		}
		next, err := cp.end(id, total)
		cp.answer(w, next, err)
		return
	}
	off, err := strconv.ParseInt(r.Header.Get(workerclient.HeaderOffset), 10, 64)
	if err != nil || off < 0 {
		http.Error(w, "stream POST needs a non-negative "+workerclient.HeaderOffset, http.StatusBadRequest)
		return
	}
	body, err := readBody(w, r)
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	next, err := cp.appendAt(id, off, body)
	cp.answer(w, next, err)
}

// readBody reads a stream POST's body of at most MaxPostBytes, sized up front
// from Content-Length when the client sent one.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body := bytes.NewBuffer(make([]byte, 0, min(max(r.ContentLength, 0), workerclient.MaxPostBytes)+1))
	_, err := body.ReadFrom(http.MaxBytesReader(w, r.Body, workerclient.MaxPostBytes))
	return body.Bytes(), err
}

// answer writes 204 with the next expected offset, or 409 for a violation.
func (cp *ControlPlane) answer(w http.ResponseWriter, next int64, err error) {
	w.Header().Set(workerclient.HeaderNext, strconv.FormatInt(next, 10))
	if err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// appendAt applies body at off: bytes already held are compared and dropped,
// new ones appended. It returns the next expected offset.
func (cp *ControlPlane) appendAt(id string, off int64, body []byte) (int64, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	s := cp.streamLocked(id)
	next := int64(len(s.data))
	if off > next {
		return next, cp.violateLocked(fmt.Errorf("run %s: gap: POST at offset %d but only %d bytes held", id, off, next))
	}
	overlap := min(next-off, int64(len(body)))
	if !bytes.Equal(s.data[off:off+overlap], body[:overlap]) {
		return next, cp.violateLocked(fmt.Errorf("run %s: resent bytes at [%d, %d) differ from those held", id, off, off+overlap))
	}
	if s.ended && overlap < int64(len(body)) {
		return next, cp.violateLocked(fmt.Errorf("run %s: %d bytes after the end marker", id, int64(len(body))-overlap))
	}
	s.data = append(s.data, body[overlap:]...)
	return int64(len(s.data)), nil
}

func (cp *ControlPlane) end(id string, total int64) (int64, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	s := cp.streamLocked(id)
	next := int64(len(s.data))
	if total != next {
		return next, cp.violateLocked(fmt.Errorf("run %s: end marker total %d but %d bytes held", id, total, next))
	}
	s.ended, s.total = true, total
	return next, nil
}

func (cp *ControlPlane) streamLocked(id string) *stream {
	s := cp.streams[id]
	if s == nil {
		s = &stream{}
		cp.streams[id] = s
	}
	return s
}

func (cp *ControlPlane) violateLocked(err error) error {
	cp.violations = append(cp.violations, err)
	return err
}
