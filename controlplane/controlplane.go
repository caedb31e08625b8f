// Package controlplane holds the domain of taskrun's reference control plane
// (`taskrun serve`): tasks submitted by users, their runs as the control plane
// records them, leases held by workers, and the Store every backend implements
// (controlplane/sqlite, controlplane/postgres; conformance in
// controlplane/storetest). The HTTP server is controlplane/server and the
// user API's client is controlplane/client.
package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// Errors every Store returns (wrapped) so callers can tell the cases apart
// with errors.Is.
var (
	// ErrNotFound: no run (or task) with that ID.
	ErrNotFound = errors.New("controlplane: not found")
	// ErrStaleFence: the caller's epoch is not the run's current one, or its
	// lease has expired. Answered 412.
	ErrStaleFence = errors.New("controlplane: stale fence: the lease is not the run's current one or has expired")
	// ErrConflict: the request contradicts what the store holds (a stream
	// gap, overlapping bytes that differ, a wrong total, bytes past the end).
	// Answered 409.
	ErrConflict = errors.New("controlplane: conflict")
	// ErrTooLarge: the run's stored output would pass its cap. Answered 413.
	ErrTooLarge = errors.New("controlplane: too large")
	// ErrFinished: the run has ended; the request cannot apply to it.
	ErrFinished = errors.New("controlplane: run has already ended")
	// ErrNotHolder: the caller's lease token is not the current lease's, or
	// the caller is not the worker the lease was handed to. Answered 403.
	ErrNotHolder = errors.New("controlplane: not the holder of the run's lease")
)

// Fence is what a worker's call for a leased run presents: the lease's
// epoch, the SHA-256 of its lease token, and the worker the call
// authenticated as. A store write of the run is allowed only when all
// three are the current lease's (and the lease is live).
type Fence struct {
	Epoch int64
	// TokenHash is the SHA-256 of the lease token the call sent.
	TokenHash [32]byte
	// Holder is the name of the worker credential the call used.
	Holder string
}

// ErrorWorkerLost is the error recorded on a run finalized because its
// worker's lease expired without a terminal status.
const ErrorWorkerLost = "worker lost"

// ErrorQueueExpired starts the error recorded on a run that waited QUEUED
// past the control plane's queue time to live.
const ErrorQueueExpired = "expired in the queue"

// TaskSpec is everything a submitted task asks of its runs: what to execute
// and where. It is what the worker receives in its Assignment.
type TaskSpec struct {
	// Model names the model entry ("scripted", "openai:gpt-4.1", ...).
	Model string `json:"model,omitempty"`
	// Image and Runtime select the container; empty: the worker's defaults.
	Image   string `json:"image,omitempty"`
	Runtime string `json:"runtime,omitempty"`
	// Command overrides the image's agent command; Env adds variables.
	Command []string `json:"command,omitempty"`
	Env     []string `json:"env,omitempty"`
	// Limits bound each run; zero fields take the worker's defaults.
	Limits workerclient.Limits `json:"limits"`
	// Egress is the egress policy file's JSON; absent: no network.
	Egress json.RawMessage `json:"egress,omitempty"`
	// Retryable allows executing the task again when a worker is lost.
	Retryable bool `json:"retryable,omitempty"`
	// KeepAlive, IdleTimeoutMillis and Ports: see SubmitRequest.
	KeepAlive         bool  `json:"keep_alive,omitempty"`
	IdleTimeoutMillis int64 `json:"idle_timeout_ms,omitempty"`
	Ports             []int `json:"ports,omitempty"`
	// Workspace is the starting workspace (a gzip'd tar written by
	// workspace.PackHome) in the shared store; nil: an empty workspace.
	Workspace *workerclient.StoredObject `json:"workspace,omitempty"`
}

// NewTask is a task to create with its first run, QUEUED.
type NewTask struct {
	Task      model.Task
	RunID     string
	SessionID string
	// PreviousRunID names the run whose session state the run resumes.
	PreviousRunID string
	Spec          TaskSpec
	// CreatedAt is the submission time; runs are leased oldest first.
	CreatedAt time.Time
}

// Run is one run as the control plane records it: identity, the task's spec,
// its lease and everything its worker reported.
type Run struct {
	ID            string          `json:"id"`
	Task          model.Task      `json:"task"`
	SessionID     string          `json:"session_id"`
	PreviousRunID string          `json:"previous_run_id,omitempty"`
	ParentRunID   string          `json:"parent_run_id,omitempty"` // a fork's parent (Store.Fork)
	Spec          TaskSpec        `json:"spec"`
	Status        model.RunStatus `json:"status"`
	// CreatedAt is when the run was queued; LeasedAt when it was last leased;
	// StartedAt and EndedAt what the worker reported (EndedAt also when the
	// control plane finalized it).
	CreatedAt time.Time  `json:"created_at"`
	LeasedAt  *time.Time `json:"leased_at,omitempty"`
	StartedAt *time.Time `json:"started_at,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// WorkerID holds (or last held) the lease; Epoch is the number of the
	// current (or last) lease, 0 before the first. The lease's token and
	// the worker credential it is bound to are the store's alone.
	WorkerID       string     `json:"worker_id,omitempty"`
	Epoch          int64      `json:"epoch"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	// CancelRequested is set when the owner cancelled a leased run: the next
	// renewal tells the worker to stop it.
	CancelRequested bool `json:"cancel_requested,omitempty"`
	// Resume is set once its owner asked to resume the run after it was
	// PAUSED: the worker that leases it restores it from its checkpoint.
	Resume bool `json:"resume,omitempty"`
	// Attempts counts the leases granted.
	Attempts int `json:"attempts"`
	// What the worker reported (PATCH).
	ExitCode         *int                        `json:"exit_code,omitempty"`
	Error            string                      `json:"error,omitempty"`
	PromptTokens     int64                       `json:"prompt_tokens"`
	CompletionTokens int64                       `json:"completion_tokens"`
	Output           string                      `json:"output,omitempty"`
	OutputTruncated  bool                        `json:"output_truncated,omitempty"`
	TracePath        string                      `json:"trace_path,omitempty"`
	Artifact         *workerclient.Artifact      `json:"artifact,omitempty"`
	Changes          *workerclient.ChangeSet     `json:"changes,omitempty"`
	Container        *workerclient.ContainerInfo `json:"container,omitempty"`
	// StreamNext is how many bytes of the output stream are held; StreamEnded
	// is set once the worker ended the stream.
	StreamNext  int64 `json:"stream_next"`
	StreamEnded bool  `json:"stream_ended"`
}

// RunFilter selects runs for ListRuns.
type RunFilter struct {
	// UserID, when set, keeps only that tenant's runs.
	UserID string
	// Status, when set, keeps only runs with that status.
	Status model.RunStatus
	// Limit caps the answer (the store applies MaxListLimit when 0 or more).
	Limit int
}

// MaxListLimit caps how many runs one ListRuns returns.
const MaxListLimit = 500

// LeaseOffer is a worker asking for one run.
type LeaseOffer struct {
	WorkerID string
	// Holder is the name of the worker credential that asked: the lease is
	// bound to it.
	Holder string
	// TokenHash is the SHA-256 of the new lease's token; the store keeps
	// only this hash, never the token.
	TokenHash [32]byte
	Now       time.Time
	TTL       time.Duration
	// Fits reports whether the worker can take the run; runs that do not fit
	// are left queued for another worker.
	Fits func(Run) bool
}

// Expired is a run whose lease the sweeper found lapsed.
type Expired struct {
	RunID string
	// Requeued: the task is retryable and the run went back to the queue;
	// otherwise it was finalized FAILED "worker lost" (or CANCELLED when its
	// owner had asked for that).
	Requeued bool
	Status   model.RunStatus
}

// Chunk is a piece of a run's output stream.
type Chunk struct {
	Offset int64
	Data   []byte
}

// RunReader is the read side of the store: what the user API and the web UI
// need. Every method returns errors wrapping ErrNotFound for unknown runs.
type RunReader interface {
	// GetRun returns one run.
	GetRun(ctx context.Context, id string) (Run, error)
	// ListRuns returns runs, newest first, that match f.
	ListRuns(ctx context.Context, f RunFilter) ([]Run, error)
	// ReadOutput returns up to max bytes of the run's output stream from
	// offset, and the run's current stream state (StreamNext, StreamEnded,
	// Status) so a follower knows whether more can come.
	ReadOutput(ctx context.Context, id string, offset int64, max int) ([]byte, Run, error)
}

// Worker is a worker as its last lease request described it.
type Worker struct {
	// ID is the worker's ID ("host/instance").
	ID string `json:"id"`
	// Capacity is what it had free when it last asked for work.
	Capacity workerclient.Capacity `json:"capacity"`
	// Labels say what it can run: runtimes, local images, backend.
	Labels workerclient.WorkerLabels `json:"labels"`
	// LastSeen is when it last asked for work: its heartbeat.
	LastSeen time.Time `json:"last_seen"`
}

// MaxWorkers caps how many workers ListWorkers returns.
const MaxWorkers = 500

// WorkerReader lists the workers the control plane heard from.
type WorkerReader interface {
	// ListWorkers returns the workers seen at or after since, most recently
	// seen first, at most MaxWorkers.
	ListWorkers(ctx context.Context, since time.Time) ([]Worker, error)
}

// Store is the control plane's durable state. Every method is one
// transaction; every implementation passes storetest.
type Store interface {
	RunReader
	WorkerReader

	// RecordWorker records a worker's heartbeat (each lease request): its
	// capacity and labels, seen at w.LastSeen.
	RecordWorker(ctx context.Context, w Worker) error

	// CreateTask records t and its first run, QUEUED.
	CreateTask(ctx context.Context, t NewTask) (Run, error)
	// Lease hands the oldest queued run that o.Fits to o.WorkerID: status
	// RUNNING, epoch raised by one, lease until o.Now+o.TTL, bound to
	// o.Holder and o.TokenHash. It returns
	// (nil, nil) when no queued run fits. No two callers, on any replica,
	// ever get the same run for the same epoch.
	Lease(ctx context.Context, o LeaseOffer) (*Run, error)
	// ReturnLease puts back a run whose lease (epoch) was granted but never
	// delivered (the long poll's client was gone when the answer was ready),
	// so it is not lost to "worker lost": a run still held under epoch with
	// nothing reported goes back to the queue, its attempt not counted, or
	// ends CANCELLED when its owner asked for that meanwhile. The epoch stays
	// raised and its lease is dead, so whoever might hold it is fenced. It
	// reports whether the run was put back; a run the lease no longer holds,
	// or whose worker already reported, is left as it is (a resumed run's
	// reports from before its pause do not count: it goes back, resume kept).
	ReturnLease(ctx context.Context, id string, epoch int64, now time.Time) (bool, error)
	// Every write under a fence (Renew, Patch, AppendOutput, EndOutput)
	// first checks it: an epoch that is not the run's current one wraps
	// ErrStaleFence; a token or holder that is not the current lease's
	// wraps ErrNotHolder (compared in constant time); then a lease that
	// ended or expired wraps ErrStaleFence.

	// Renew extends the lease (current and unexpired at now) to now+ttl and
	// returns the run (CancelRequested tells the worker to stop it).
	Renew(ctx context.Context, id string, f Fence, now time.Time, ttl time.Duration) (Run, error)
	// Patch applies a worker's report under its fence. A terminal status
	// ends the lease; after it, a repeated PATCH with the same fence changes
	// nothing. It returns the run after the change and whether it changed.
	Patch(ctx context.Context, id string, f Fence, now time.Time, p workerclient.PatchTaskRunRequest) (Run, bool, error)
	// AppendOutput applies one stream POST under the fence, with the offset
	// rules of docs/control-plane-api.md, refusing to hold more than maxBytes.
	// It returns the stream's next offset; a violation wraps ErrConflict.
	AppendOutput(ctx context.Context, id string, f Fence, now time.Time, offset int64, data []byte, maxBytes int64) (int64, error)
	// EndOutput marks the stream ended at total (under the fence).
	EndOutput(ctx context.Context, id string, f Fence, now time.Time, total int64) (int64, error)
	// Cancel cancels a run for its owner: a queued run ends CANCELLED at
	// once; a leased one is flagged for its worker. An ended run wraps
	// ErrFinished.
	Cancel(ctx context.Context, id string, now time.Time) (Run, error)
	// Resume puts a PAUSED run back in the queue, marked Resume, for a
	// worker to restore from its checkpoint. It is conditional on the run
	// being PAUSED: of concurrent resumes exactly one wins, the others (and
	// a run in any other status) wrap ErrConflict. A resumed run keeps its
	// place (CreatedAt) in the queue and is not expired by ExpireQueued: it
	// waits for a worker until one takes it or its owner cancels it.
	Resume(ctx context.Context, id string, now time.Time) (Run, error)
	// Fork queues one new run per ID of ids, each a fork of the PAUSED or
	// ended run parent: a run of the parent's task and session with
	// ParentRunID set and, when prompt is not empty, that prompt as its
	// task's. The worker that leases one starts it from the parent's
	// checkpoint or stored home. A parent queued or running wraps
	// ErrConflict.
	Fork(ctx context.Context, parent string, ids []string, prompt string, now time.Time) ([]Run, error)
	// ExpireLeases finalizes or requeues every run whose lease lapsed before
	// now.
	ExpireLeases(ctx context.Context, now time.Time) ([]Expired, error)
	// ExpireQueued ends FAILED, at now and with reason as its error, every
	// run still QUEUED, not resumed, that was submitted before before (a batch at a time),
	// and returns their IDs.
	ExpireQueued(ctx context.Context, before, now time.Time, reason string) ([]string, error)
	// CountByStatus counts runs per status: userID's runs, or all runs when
	// userID is empty.
	CountByStatus(ctx context.Context, userID string) (map[model.RunStatus]int, error)
	// Ready reports whether the database answers and the schema is current.
	Ready(ctx context.Context) error
	// Close releases the store.
	Close() error
}

// MaxAttempts bounds how many times a retryable run is leased: a run whose
// worker is lost on its last attempt is finalized FAILED "worker lost".
const MaxAttempts = 3
