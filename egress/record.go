package egress

import (
	"encoding/json"
	"io"
	"slices"
	"sync"
	"time"
)

// Decisions in the record.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"
)

// Entry is one line of the connection record (egress.jsonl): one CONNECT
// tunnel, or one HTTP request (plain, or inside an intercepted tunnel).
type Entry struct {
	Time time.Time `json:"time"`
	// Kind is "connect" for a tunnel passed through untouched, "http" for a
	// plain HTTP request and "https" for a request inside an intercepted tunnel.
	Kind string `json:"kind"`
	Host string `json:"host"`
	Port int    `json:"port"`
	// Method and Path are set where the request was seen in clear.
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	// Address is the IP the proxy connected to (or refused).
	Address  string `json:"address,omitempty"`
	Decision string `json:"decision"`
	// Rule is the rule that allowed the connection; empty when none did.
	Rule string `json:"rule,omitempty"`
	// Reason says why a connection was denied or ended early.
	Reason string `json:"reason,omitempty"`
	// Status is the upstream's HTTP status where the request was seen.
	Status int `json:"status,omitempty"`
	// Credential names the header the proxy injected, never its value.
	Credential string `json:"credential,omitempty"`
	BytesUp    int64  `json:"bytes_up"`
	BytesDown  int64  `json:"bytes_down"`
}

// Summary totals a run's connection record, for audit.json.
type Summary struct {
	Connections int      `json:"connections"`
	Allowed     int      `json:"allowed"`
	Denied      int      `json:"denied"`
	BytesUp     int64    `json:"bytes_up"`
	BytesDown   int64    `json:"bytes_down"`
	Hosts       []string `json:"hosts,omitempty"`
	DeniedHosts []string `json:"denied_hosts,omitempty"`
	// BudgetExceeded names the budget the run ran out of, if any.
	BudgetExceeded string `json:"budget_exceeded,omitempty"`
}

// maxSummaryHosts bounds the host lists in a summary.
const maxSummaryHosts = 100

// recorder appends entries as JSON lines and keeps the summary.
type recorder struct {
	mu  sync.Mutex
	w   io.Writer
	enc *json.Encoder
	sum Summary
	err error
}

func newRecorder(w io.Writer) *recorder {
	r := &recorder{w: w}
	if w != nil {
		r.enc = json.NewEncoder(w)
	}
	return r
}

func (r *recorder) add(e Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sum.Connections++
	r.sum.BytesUp += e.BytesUp
	r.sum.BytesDown += e.BytesDown
	if e.Decision == DecisionAllow {
		r.sum.Allowed++
		r.sum.Hosts = addHost(r.sum.Hosts, e.Host)
	} else {
		r.sum.Denied++
		r.sum.DeniedHosts = addHost(r.sum.DeniedHosts, e.Host)
	}
	if r.enc != nil && r.err == nil {
		r.err = r.enc.Encode(e)
	}
}

func addHost(hosts []string, h string) []string {
	if slices.Contains(hosts, h) || len(hosts) >= maxSummaryHosts {
		return hosts
	}
	return append(hosts, h)
}

func (r *recorder) summary() Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sum
	s.Hosts = slices.Clone(s.Hosts)
	s.DeniedHosts = slices.Clone(s.DeniedHosts)
	return s
}

func (r *recorder) writeErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}
