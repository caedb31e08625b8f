package probe

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Expectation is what the executor asked of the sandbox. Every field is
// optional; an unset field is not checked. A requested property the probe
// could not observe is a contradiction (fail closed).
type Expectation struct {
	// NonRoot requires uid != 0 and gid != 0.
	NonRoot bool `json:"non_root,omitempty"`
	// UID requires this exact uid.
	UID *int `json:"uid,omitempty"`
	// CapEffZero requires an empty effective capability set.
	CapEffZero bool `json:"cap_eff_zero,omitempty"`
	// CapBndZero requires an empty bounding set (nothing can be regained).
	CapBndZero bool `json:"cap_bnd_zero,omitempty"`
	// NoNewPrivs requires NoNewPrivs: 1.
	NoNewPrivs bool `json:"no_new_privs,omitempty"`
	// SeccompFilter requires Seccomp: 2 (filter mode).
	SeccompFilter bool `json:"seccomp_filter,omitempty"`
	// RootfsReadOnly requires / mounted read-only and not writable.
	RootfsReadOnly bool `json:"rootfs_read_only,omitempty"`
	// ProcSysReadOnly requires /proc/sys mounted read-only.
	ProcSysReadOnly bool `json:"proc_sys_read_only,omitempty"`
	// NetworkNone requires no non-loopback interface and every egress probe
	// to fail.
	NetworkNone bool `json:"network_none,omitempty"`
	// PidsMax requires this pids.max value.
	PidsMax *int64 `json:"pids_max,omitempty"`
	// MemoryLimit requires this memory limit in bytes.
	MemoryLimit *int64 `json:"memory_limit,omitempty"`
	// NoDockerSocket requires that no unix socket answers Docker's GET /info
	// and that the socket search was complete.
	NoDockerSocket bool `json:"no_docker_socket,omitempty"`
	// NoServiceAccountToken requires that no Kubernetes service account
	// token is mounted at its well-known paths.
	NoServiceAccountToken bool `json:"no_service_account_token,omitempty"`
	// SkipEgressProbes leaves out the egress probes: where the sandbox has
	// a network interface by design (a Pod, confined by its NetworkPolicy),
	// the self-check does not dial public or metadata addresses from it.
	// It cannot be combined with NetworkNone.
	SkipEgressProbes bool `json:"skip_egress_probes,omitempty"`
	// Unreachable are addresses the sandbox must not connect to (its node,
	// a peer): each is probed, also when SkipEgressProbes is set, and a
	// connect that succeeds, or a target whose address is unknown, is a
	// contradiction.
	Unreachable []ReachTarget `json:"unreachable,omitempty"`
}

// ParseExpectation decodes the --expect JSON. Unknown fields are an error so
// that a misspelt requirement is never silently skipped.
func ParseExpectation(raw []byte) (Expectation, error) {
	var e Expectation
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return Expectation{}, fmt.Errorf("parse expectation (fields are those of probe.Expectation): %w", err)
	}
	return e, nil
}

// Contradictions lists, in words, every way r contradicts e. Empty means the
// sandbox is what the executor asked for.
func (e Expectation) Contradictions(r Report) []string {
	var out []string
	add := func(bad bool, format string, args ...any) {
		if bad {
			out = append(out, fmt.Sprintf(format, args...))
		}
	}
	add(e.NonRoot && (r.UID == 0 || r.GID == 0), "runs as uid %d gid %d, expected non-root", r.UID, r.GID)
	if e.UID != nil {
		add(r.UID != *e.UID, "runs as uid %d, expected %d", r.UID, *e.UID)
	}
	add(e.CapEffZero && r.CapEff != 0, "effective capabilities %#x, expected none", r.CapEff)
	add(e.CapBndZero && r.CapBnd != 0, "bounding capabilities %#x, expected none", r.CapBnd)
	add(e.NoNewPrivs && r.NoNewPrivs != 1, "NoNewPrivs is %s, expected 1", intOrUnknown(r.NoNewPrivs))
	add(e.SeccompFilter && r.Seccomp != 2, "Seccomp mode is %s, expected 2 (filter)", intOrUnknown(r.Seccomp))
	add(e.RootfsReadOnly && !r.RootfsReadOnly, "root filesystem is mounted read-write, expected read-only")
	add(e.RootfsReadOnly && r.RootfsWriteError == "", "created a file in /, expected the root filesystem to be read-only")
	add(e.ProcSysReadOnly && !r.ProcSysReadOnly, "/proc/sys is not mounted read-only")
	if e.NetworkNone {
		add(len(r.Interfaces) > 0, "network interfaces %v are up, expected loopback only", r.Interfaces)
		for _, eg := range r.Egress {
			add(eg.Reachable, "egress %s to %s succeeded, expected no network", eg.Name, eg.Target)
		}
		add(len(r.Egress) == 0, "no egress probe ran, cannot confirm no network")
	}
	if e.PidsMax != nil {
		add(r.PidsMax != *e.PidsMax, "pids.max is %s, expected %d", limitString(r.PidsMax), *e.PidsMax)
	}
	if e.MemoryLimit != nil {
		add(r.MemoryLimit != *e.MemoryLimit, "memory limit is %s, expected %d", limitString(r.MemoryLimit), *e.MemoryLimit)
	}
	add(e.NoDockerSocket && len(r.DockerSockets) > 0, "Docker API reachable through %v", r.DockerSockets)
	add(e.NoDockerSocket && !r.SocketSearchComplete, "socket search was incomplete, cannot confirm no Docker socket")
	add(e.NoServiceAccountToken && len(r.ServiceAccountTokens) > 0, "service account token mounted at %v, expected none", r.ServiceAccountTokens)
	if len(e.Unreachable) > 0 {
		out = append(out, reachContradictions(e.Unreachable, r.Reach)...)
	}
	add(e.SkipEgressProbes && e.NetworkNone, "expectation asks for network none but skips the egress probes that would confirm it")
	return out
}

func intOrUnknown(v int) string {
	if v == Unknown {
		return "unknown"
	}
	return fmt.Sprint(v)
}

func limitString(v int64) string {
	switch v {
	case Unknown:
		return "unknown"
	case Unlimited:
		return "max (unlimited)"
	}
	return fmt.Sprint(v)
}
