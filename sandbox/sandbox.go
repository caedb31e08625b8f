// Package sandbox defines the contract between taskrun and a container backend:
// what to run (Spec), how tightly to confine it (Policy) and what happened (Result).
//
// A Backend is used in this order for each run:
//
//  1. Start creates the container with the Spec and Policy applied, attaches to
//     its output streams *before* starting it, and starts it. On error nothing is
//     left behind. A Creator splits it: Create, then Created.Start (or
//     Created.Discard), so the caller can prepare what the container needs
//     only once it runs while the engine creates it.
//  2. Handle.Posture, and Stats of a handle that is a StatsReader, may be
//     called any number of times while the run is live.
//  3. Handle.Wait blocks until the container exits, the Spec's timeout passes or
//     ctx is cancelled. On timeout or cancellation it stops the container (SIGTERM,
//     then SIGKILL after the grace period). It returns only after both output
//     streams are fully drained into the Streams writers.
//  4. Handle.Close removes the container. It must always be called, also after a
//     failed Wait, and it uses a context that is not cancelled with the run's.
//
// A Backend is safe for concurrent use by many runs; a Handle belongs to one run
// and its methods must not be called concurrently with each other, except
// Posture and Stats, which may race with Wait.
package sandbox

import (
	"context"
	"io"
	"time"

	"github.com/taskrun/taskrun/model"
)

// Backend runs containers.
type Backend interface {
	// Start creates, attaches and starts a container for spec under policy.
	Start(ctx context.Context, spec Spec, policy Policy, streams Streams) (Handle, error)
}

// Orphans is implemented by a backend that lists its containers
// (Capabilities.ListsContainers): what a host's recovery does with the
// containers its dead executors left.
type Orphans interface {
	// OrphanExists reports whether container id still exists.
	OrphanExists(ctx context.Context, id string) (bool, error)
	// StopOrphan stops container id (SIGTERM, SIGKILL after grace); one
	// that is gone or stopped is fine.
	StopOrphan(ctx context.Context, id string, grace time.Duration) error
	// OrphanLogs copies the engine's log of container id's stdout and
	// stderr to the writers.
	OrphanLogs(ctx context.Context, id string, stdout, stderr io.Writer) error
	// RemoveOrphan removes container id; one that is gone is fine.
	RemoveOrphan(ctx context.Context, id string) error
	// ReapGone removes the containers whose executor gone proves gone (by
	// its ID and, when the container carries it, its process record),
	// sparing the containers in spare, and returns how many it removed.
	ReapGone(ctx context.Context, gone func(executorID, process string) (bool, string), spare []string) (int, error)
}

// Creator is implemented by backends that can create a container before
// starting it. Backend.Start stays the one-call equivalent.
type Creator interface {
	// Create creates the container for spec under policy and does not start
	// it. The spec's bind-mount sources must exist; what they hold is read
	// only when the container starts. On error nothing is left behind.
	Create(ctx context.Context, spec Spec, policy Policy) (Created, error)
}

// Created is a container created and not started. Exactly one of Start and
// Discard must be called, from one goroutine.
type Created interface {
	// ID is the backend's identifier for the container.
	ID() string
	// Start attaches to the container's output and starts it, as
	// Backend.Start does once it created it. On error the container is
	// removed.
	Start(ctx context.Context, streams Streams) (Handle, error)
	// Discard removes the container without starting it, on a context that
	// should not be cancelled with the run's.
	Discard(ctx context.Context) error
}

// EngineDescriber is implemented by backends that can describe the host
// they run containers on (for Docker: from `docker info`), which audits read
// for facts such as whether AppArmor exists.
type EngineDescriber interface {
	HostFacts(ctx context.Context) (HostFacts, error)
}

// ImageChecker is implemented by backends that can tell, before anything is
// created, whether an image exists locally. Callers use it to refuse a run
// early with a clear error.
type ImageChecker interface {
	CheckImage(ctx context.Context, image string) error
}

// Handle is one running container.
type Handle interface {
	// ID is the backend's identifier for the container.
	ID() string
	// Posture reports how the live container is confined, as the backend
	// sees it (for Docker: from `docker inspect`). Audits read it.
	Posture(ctx context.Context) (Posture, error)
	// Wait blocks until the run ends and returns how it ended.
	Wait(ctx context.Context) Result
	// Close removes the container and releases everything the handle holds.
	Close(ctx context.Context) error
}

// Streams receive the container's demultiplexed output. Writers are called from
// one goroutine each and should not block for long: pass a spool, not a network
// connection.
type Streams struct {
	Stdout io.Writer
	Stderr io.Writer
}

// Mount is a host directory made visible inside the container.
type Mount struct {
	// Source is the absolute host path.
	Source string `json:"source"`
	// Target is the absolute path inside the container.
	Target string `json:"target"`
	// ReadOnly mounts it read-only.
	ReadOnly bool `json:"read_only,omitempty"`
}

// Spec says what to run.
type Spec struct {
	// Name is an optional container name.
	Name string `json:"name,omitempty"`
	// Run identifies the run; backends record it on the container (for
	// Docker as the dev.taskrun.tenant/conversation/task/run labels) so that
	// audits and the reaper can tell whose container it is.
	Run model.RunRef `json:"run"`
	// Image is the image reference; it must already exist locally (an
	// ImageResolver pulls it before Start, under the run's pull policy).
	Image string `json:"image"`
	// Cmd replaces the image's default command when non-empty.
	Cmd []string `json:"cmd,omitempty"`
	// Entrypoint replaces the image's entrypoint when non-empty.
	Entrypoint []string `json:"entrypoint,omitempty"`
	// Wrapper, when non-empty, runs in front of the container's command: the
	// process started is Wrapper followed by the entrypoint and command that
	// would otherwise run (Entrypoint/Cmd, else the image's). The in-sandbox
	// self-check uses it, so it works with any image.
	Wrapper []string `json:"wrapper,omitempty"`
	// Env is a list of KEY=VALUE pairs.
	Env []string `json:"env,omitempty"`
	// WorkingDir is the process's working directory inside the container.
	WorkingDir string `json:"working_dir,omitempty"`
	// Mounts are the bind mounts. Only the run's own directories belong here.
	Mounts []Mount `json:"mounts,omitempty"`
	// Labels are added to the container next to the dev.taskrun.* labels.
	Labels map[string]string `json:"labels,omitempty"`
	// Timeout bounds the run's wall time; 0 means no timeout.
	Timeout time.Duration `json:"timeout,omitempty"`
	// StopGrace is how long a stopped container gets between SIGTERM and SIGKILL.
	StopGrace time.Duration `json:"stop_grace,omitempty"`
	// DiskBytes caps what the run may store under its mounts, for backends
	// that hold the mounts' data themselves (a Kubernetes Pod's data
	// volume); 0 leaves the backend's default. A bind mount (Docker) is
	// capped on the host instead, where the run directory lives.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// RestoreFrom, when set, is a host directory holding a checkpoint
	// (Checkpointer.Checkpoint): the sandbox is restored from it and goes
	// on where it stopped instead of running Cmd. Only a Checkpointer
	// backend accepts it.
	RestoreFrom string `json:"restore_from,omitempty"`
}

// Result is how a run ended.
type Result struct {
	// ExitCode is the main process's exit status (-1 when unknown).
	ExitCode int `json:"exit_code"`
	// OOMKilled is set when the kernel killed the container for exceeding its memory limit.
	OOMKilled bool `json:"oom_killed"`
	// TimedOut is set when the Spec's timeout stopped the container.
	TimedOut bool `json:"timed_out"`
	// Cancelled is set when the caller's context stopped the container.
	Cancelled bool `json:"cancelled"`
	// StartedAt and FinishedAt are the container's own start and end times.
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	// Err is set when the backend failed to run or observe the container.
	Err error `json:"-"`
}

// Succeeded reports whether the run exited 0 on its own.
func (r Result) Succeeded() bool {
	return r.Err == nil && r.ExitCode == 0 && !r.OOMKilled && !r.TimedOut && !r.Cancelled
}
