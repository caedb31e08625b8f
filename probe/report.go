// Package probe is taskrun's in-sandbox self-check. The static taskrun-probe
// binary runs as the container's entrypoint wrapper: before the agent starts
// it observes its own confinement from the inside (credentials, capabilities,
// seccomp, mounts, cgroup limits, egress, reachable Docker sockets), writes
// one report line to stderr, compares the observations with the executor's
// Expectation and refuses to start the agent on any contradiction.
//
// Because the report line is written before the agent's first instruction
// runs, the agent cannot forge it; the executor reads it back with an
// Interceptor around the container's stderr, checking the per-run nonce.
package probe

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// LinePrefix starts the report line: "TASKRUN-PROBE <nonce> <base64 JSON>\n".
const LinePrefix = "TASKRUN-PROBE"

// ExitContradiction is the probe's exit code when it refuses to start the
// command because the sandbox contradicts the expectation.
const ExitContradiction = 86

// MaxLine bounds the report line, and so the Interceptor's buffer.
const MaxLine = 64 << 10

// Unknown marks an integer field the probe could not read; Unlimited marks a
// cgroup limit of "max".
const (
	Unknown   = -2
	Unlimited = -1
)

// Report is what the probe observed inside the sandbox.
type Report struct {
	// Nonce is the per-run value passed by the executor with --nonce.
	Nonce string `json:"nonce"`
	// ParkedAt is set for a container parked ahead of its run (package
	// warmpool): Egress, UnixSockets, DockerSockets and
	// SocketSearchComplete are then what the self-check observed when it
	// parked, at ParkedAt, with nothing else run in the container since
	// (see Config.Parked); the rest was observed at CollectedAt.
	ParkedAt time.Time `json:"parked_at,omitzero"`
	// UID and GID are the real ids; Groups are the supplementary groups.
	UID    int   `json:"uid"`
	GID    int   `json:"gid"`
	Groups []int `json:"groups,omitempty"`
	// Capability sets from /proc/self/status.
	CapEff uint64 `json:"cap_eff"`
	CapPrm uint64 `json:"cap_prm"`
	CapBnd uint64 `json:"cap_bnd"`
	CapAmb uint64 `json:"cap_amb"`
	// NoNewPrivs and Seccomp are the /proc/self/status values (Seccomp 2 is
	// filter mode); Unknown when the kernel does not report them.
	NoNewPrivs int `json:"no_new_privs"`
	Seccomp    int `json:"seccomp"`
	// AppArmor is /proc/self/attr/current, empty when unavailable.
	AppArmor string `json:"apparmor,omitempty"`
	// RootfsReadOnly is true when / is mounted read-only.
	RootfsReadOnly bool `json:"rootfs_read_only"`
	// RootfsWriteError is why creating a file in / failed; empty means the
	// file was created (and removed), i.e. / is writable by this process.
	RootfsWriteError string `json:"rootfs_write_error,omitempty"`
	// ProcSysReadOnly is true when /proc/sys is mounted read-only.
	ProcSysReadOnly bool `json:"proc_sys_read_only"`
	// Mounts are the entries of /proc/self/mountinfo.
	Mounts []Mount `json:"mounts,omitempty"`
	// PidsMax and MemoryLimit are the cgroup limits seen inside: Unlimited
	// for "max", Unknown when no cgroup file could be read.
	PidsMax     int64 `json:"pids_max"`
	MemoryLimit int64 `json:"memory_limit"`
	// Interfaces are the non-loopback network interfaces that are up.
	Interfaces []string `json:"interfaces,omitempty"`
	// Egress holds one result per network probe.
	Egress []Egress `json:"egress,omitempty"`
	// Reach are the connects to the addresses the sandbox must not reach
	// (Expectation.Unreachable), in its order.
	Reach []Egress `json:"reach,omitempty"`
	// UnixSockets are the sockets found by the bounded walk of /;
	// DockerSockets are those that answered Docker's GET /info.
	UnixSockets   []string `json:"unix_sockets,omitempty"`
	DockerSockets []string `json:"docker_sockets,omitempty"`
	// SocketSearchComplete is true when the socket walk covered everything
	// it meant to (it did not stop at its entry bound, was not cancelled and
	// could read its root); otherwise DockerSockets may miss some.
	SocketSearchComplete bool `json:"socket_search_complete"`
	// ServiceAccountTokens are the Kubernetes service account token files
	// found at their well-known paths.
	ServiceAccountTokens []string `json:"service_account_tokens,omitempty"`
	// Command is set when the command to start cannot start as this uid;
	// the self-check then does not start it.
	Command *CommandProblem `json:"command,omitempty"`
	// Errors lists observations that could not be made.
	Errors []string `json:"errors,omitempty"`
	// CollectedAt is when collection finished (container clock).
	CollectedAt time.Time `json:"collected_at"`
}

// Mount is one mountinfo entry.
type Mount struct {
	Target   string `json:"target"`
	Root     string `json:"root,omitempty"`
	FSType   string `json:"fstype"`
	Source   string `json:"source,omitempty"`
	ReadOnly bool   `json:"ro"`
	Options  string `json:"options,omitempty"`
}

// Egress is the result of one network reachability probe.
type Egress struct {
	// Name identifies the probe: "tcp", "dns" or "metadata".
	Name string `json:"name"`
	// Target is the address or name tried.
	Target string `json:"target"`
	// Reachable is true when the connect or lookup succeeded.
	Reachable bool `json:"reachable"`
	// Error is why it failed.
	Error string `json:"error,omitempty"`
}

// ErrNotReportLine is returned by ParseLine for a line that is not a report
// line for the expected nonce.
var ErrNotReportLine = errors.New("not a taskrun-probe report line")

// FormatLine encodes r as the single stderr report line, newline included.
func FormatLine(r Report) ([]byte, error) {
	if r.Nonce == "" || strings.ContainsAny(r.Nonce, " \n") {
		return nil, fmt.Errorf("probe nonce %q must be non-empty without spaces or newlines", r.Nonce)
	}
	js, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode probe report: %w", err)
	}
	line := LinePrefix + " " + r.Nonce + " " + base64.StdEncoding.EncodeToString(js) + "\n"
	if len(line) > MaxLine {
		return nil, fmt.Errorf("probe report line is %d bytes, over the %d limit", len(line), MaxLine)
	}
	return []byte(line), nil
}

// ParseLine decodes a report line (with or without its trailing newline) and
// checks that it carries nonce.
func ParseLine(line []byte, nonce string) (Report, error) {
	s := strings.TrimSuffix(string(line), "\n")
	fields := strings.Split(s, " ")
	if len(fields) != 3 || fields[0] != LinePrefix {
		return Report{}, ErrNotReportLine
	}
	if nonce == "" || fields[1] != nonce {
		return Report{}, fmt.Errorf("%w: nonce mismatch", ErrNotReportLine)
	}
	js, err := base64.StdEncoding.DecodeString(fields[2])
	if err != nil {
		return Report{}, fmt.Errorf("%w: %w", ErrNotReportLine, err)
	}
	var r Report
	if err := json.Unmarshal(js, &r); err != nil {
		return Report{}, fmt.Errorf("%w: %w", ErrNotReportLine, err)
	}
	if r.Nonce != nonce {
		return Report{}, fmt.Errorf("%w: embedded nonce mismatch", ErrNotReportLine)
	}
	return r, nil
}
