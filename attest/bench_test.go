package attest_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/taskrun/taskrun/attest"
)

// BenchmarkSign measures what attesting costs a run: building the
// statement of a run with 64 stored objects and a full predicate, and
// signing it. The budget is 5 ms per run.
func BenchmarkSign(b *testing.B) {
	subjects := make([]attest.Subject, 64)
	for i := range subjects {
		subjects[i] = attest.Subject{Name: fmt.Sprintf("tenants/u1/conversations/c1/tasks/t1/runs/r1/artifacts/file-%03d.txt", i), SHA256: strings.Repeat("ab", 32)}
	}
	pred := attest.Predicate{
		Run:     runID,
		Image:   attest.Image{Ref: "taskrun/agent:local", Digest: "sha256:" + strings.Repeat("cd", 32)},
		Runtime: "runc", Backend: "docker",
		Policy:    json.RawMessage(`{"user":"10001:10001","read_only_rootfs":true,"tmpfs_size_bytes":67108864,"pids_limit":256,"memory_bytes":1073741824,"nano_cpus":1000000000,"network_mode":"none","nofile":1024,"log_max_size":"10m","log_max_file":2}`),
		Isolation: &attest.Isolation{Audit: "pass", SelfCheck: "pass", Posture: json.RawMessage(`{"cap_add":[],"cap_drop":["ALL"],"seccomp":"default","no_new_privileges":true}`)},
		Outcome:   attest.Outcome{Status: "SUCCEEDED"},
		Timings:   attest.Timings{Phases: json.RawMessage(`[{"phase":"plan","start_ms":0,"duration_ms":1}]`)},
	}
	for _, alg := range []string{"ed25519", "ecdsa"} {
		b.Run(alg, func(b *testing.B) {
			kp := newKeyPair(b, alg)
			start := cpuTime(b)
			for b.Loop() {
				if _, err := attest.Sign(b.Context(), kp.signer, subjects, pred); err != nil {
					b.Fatal(err)
				}
			}
			// On a shared machine wall time per op includes waiting for a
			// core; the process's CPU time per op is the cost itself.
			b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
