package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"

	"github.com/taskrun/taskrun/workerclient"
)

// countingControlPlane is a control plane that speaks the worker's two
// endpoints but keeps only counts: stream bytes are checked for order and
// dropped, so a gigabyte of output costs it no memory.
type countingControlPlane struct {
	srv *http.Server
	ln  net.Listener

	mu     sync.Mutex
	m      meter
	ended  bool
	status string
}

func newCountingControlPlane() *countingControlPlane {
	cp := &countingControlPlane{}
	mux := http.NewServeMux()
	mux.HandleFunc("PATCH /v1/task-runs/{id}", cp.patch)
	mux.HandleFunc("POST /v1/task-runs/{id}/stream", cp.stream)
	cp.srv = &http.Server{Handler: mux}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic("listen on loopback: " + err.Error())
	}
	cp.ln = ln
	go cp.srv.Serve(ln)
	return cp
}

func (cp *countingControlPlane) url() string { return "http://" + cp.ln.Addr().String() }

func (cp *countingControlPlane) close() { cp.srv.Close() }

func (cp *countingControlPlane) patch(w http.ResponseWriter, r *http.Request) {
	var req workerclient.PatchTaskRunRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cp.mu.Lock()
	cp.status = string(req.Status)
	cp.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// stream accepts a POST whose offset is where the stream ends, or an end
// marker; anything else is answered 409 with the expected offset.
func (cp *countingControlPlane) stream(w http.ResponseWriter, r *http.Request) {
	cp.mu.Lock()
	next := cp.m.bytes
	cp.mu.Unlock()
	if r.Header.Get(workerclient.HeaderEnd) == "true" {
		cp.mu.Lock()
		cp.ended = r.Header.Get(workerclient.HeaderTotal) == strconv.FormatInt(next, 10)
		cp.mu.Unlock()
		w.Header().Set(workerclient.HeaderNext, strconv.FormatInt(next, 10))
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if off, err := strconv.ParseInt(r.Header.Get(workerclient.HeaderOffset), 10, 64); err != nil || off != next {
		w.Header().Set(workerclient.HeaderNext, strconv.FormatInt(next, 10))
		http.Error(w, "offset must be "+strconv.FormatInt(next, 10), http.StatusConflict)
		return
	}
	buf := make([]byte, readBuffer)
	for {
		n, err := r.Body.Read(buf)
		cp.mu.Lock()
		cp.m.add(n)
		cp.mu.Unlock()
		if err == io.EOF {
			break
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	cp.mu.Lock()
	w.Header().Set(workerclient.HeaderNext, strconv.FormatInt(cp.m.bytes, 10))
	cp.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// result is what arrived, and why it does not count when the stream was not
// ended with the right total or the run did not succeed.
func (cp *countingControlPlane) result() (transfer, string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	switch {
	case cp.status != "SUCCEEDED":
		return cp.m.transfer(), "run ended " + cp.status
	case !cp.ended:
		return cp.m.transfer(), "stream not ended with the right total"
	}
	return cp.m.transfer(), ""
}
