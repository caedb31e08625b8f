// Package audit checks a container's isolation against the CIS Docker Benchmark
// 1.6.0 §5 (container runtime), the Kubernetes Pod Security Standards
// "restricted" profile mapped onto Docker fields, and taskrun's own stricter
// rules. The rules are pure functions over a Posture, the facts a sandbox
// backend reports about a live container (sandbox.Posture), so a stored
// isolation record can be re-checked years later without a Docker daemon.
// The backends read the postures of live containers (sandbox/docker's
// Backend.Postures, sandbox/kubernetes' for Pods, and ParseInspect for a
// saved `docker inspect`); this package links no container client.
package audit

import "github.com/taskrun/taskrun/sandbox"

// Posture is the container facts the rules read (sandbox.Posture).
type Posture = sandbox.Posture

// Mount is one mount of a Posture.
type Mount = sandbox.PostureMount

// Ulimit is one resource limit of a Posture.
type Ulimit = sandbox.Ulimit
