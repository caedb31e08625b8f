package executor

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/warmpool"
	"github.com/taskrun/taskrun/workerclient"
)

// RuntimePaths is the host layout of run directories.
type RuntimePaths interface {
	PersistentUserDir(userID string) string
	RuntimeTaskRunDir(userID, conversationID, taskID, taskRunID string) string
	RuntimeTaskRunHomeDir(userID, conversationID, taskID, taskRunID string) string
	RuntimeTaskRunArtifactsDir(userID, conversationID, taskID, taskRunID string) string
	RuntimeTaskRunGlobalDir(userID, conversationID, taskID, taskRunID string) string
	RunOutputDir(userID, conversationID, taskID, taskRunID string) string
}

// TaskRunUpdater reports a run's status to the control plane.
type TaskRunUpdater interface {
	UpdateRunStatus(ctx context.Context, taskRunID string, req *workerclient.PatchTaskRunRequest) error
}

// runInput is everything one run needs: the machine it runs on and the
// run itself. Host.runInput composes it from the host's Config and a Spec;
// the phases read it through the run's plan.
type runInput struct {
	// root is the runs root: the journal (without Journal) and the disk
	// admission live under it. Host sets it; only a phase test's input
	// may leave it empty, and then neither is done.
	root string
	// Task is the task to run. Its UserID, ConversationID and ID place the run.
	Task *model.Task
	// Run is the run to execute; Run.PreviousRunID names a run to resume.
	Run *model.TaskRun
	// SessionID names the agent session; traces go under traces/<SessionID>/.
	SessionID string
	// Paths is the host layout of run directories.
	Paths RuntimePaths
	// Persist stores run state, the output log, traces and the isolation record.
	Persist persist.PersistStorage
	// ArtifactStorage stores the files the agent delivers.
	ArtifactStorage persist.ArtifactStorage
	// Updater receives the run's status updates.
	Updater TaskRunUpdater
	// StreamSender, when non-nil, receives the run's stdout as deltas.
	StreamSender workerclient.StreamSender
	// Model is the model the agent may use through the run's gateway.
	Model config.ModelEntry
	// Egress is the run's egress policy. Zero (the default) means no route
	// out at all; otherwise the container, still with network none, reaches
	// what the policy allows through a per-run proxy (package egress). It
	// needs RelayBinary in HelpersDir.
	Egress egress.Policy

	// Sandbox runs the container.
	Sandbox sandbox.Backend
	// Image is the run image; DefaultImage when empty. A digest reference
	// (name@sha256:...) runs exactly that image.
	Image string
	// Pull says when the image is pulled from its registry:
	// sandbox.PullMissing (the default, when empty) pulls it only when it
	// does not exist locally, PullAlways before every run, PullNever never.
	// The backend authenticates with the docker CLI's config and
	// credential helpers.
	Pull sandbox.PullPolicy
	// AllowedImages, when non-empty, is the only images a run may use
	// (package imageref: NAME, NAME:TAG, NAME@sha256:HEX, with * globs;
	// references normalized as docker does). Any other image is refused
	// before anything is pulled or created, with an error wrapping
	// ErrImageNotAllowed.
	AllowedImages []string
	// Command replaces the image's default command when non-empty.
	Command []string
	// Entrypoint replaces the image's entrypoint when non-empty, as
	// `docker run --entrypoint` does: the container runs Entrypoint followed
	// by Command, and the image's own command is dropped.
	Entrypoint []string
	// Env adds NAME=VALUE variables to the agent's environment, after the
	// image's own. It is visible to the agent and everything it runs: a
	// secret belongs to the model gateway (Model) or the credential broker,
	// never here. Names taskrun sets itself (TASKRUN_*, HOME, the proxy
	// variables) are refused (see config.CheckEnv).
	Env []string
	// Policy confines the container; sandbox.DefaultPolicy() when zero.
	Policy sandbox.Policy
	// Helpers are the in-container helper files (package helpers), such as
	// helpers.FromExecutable: the helpers installed with the taskrun binary,
	// or the binary itself, which acts as the self-check and the relay. With Helpers or HelpersDir every run starts
	// with the in-sandbox self-check; a contradiction with Policy refuses
	// the run. Exactly the helper files are mounted, read-only, file by file
	// under /.taskrun/bin. Set at most one of Helpers and HelpersDir; with
	// neither the run has no self-check.
	Helpers helpers.Files
	// HelpersDir holds separately built static helpers: taskrun-probe
	// (required) and taskrun-relay; only those files are mounted.
	HelpersDir string
	// UIDs, when set, leases each run a host uid/gid of its own: the
	// container runs as it (replacing Policy.User), the run directory is
	// owned by it, and it is released once the container is gone. Runs then
	// never share per-user kernel limits (inotify instances, processes).
	// Without it every run is Policy.User.
	UIDs *uidpool.Pool
	// WarmPool, when set, starts the run in a container its pool parked
	// ahead of time (package warmpool), when one of the run's key (its
	// image, policy, helpers, disk cap, timeout and labels) is ready; else
	// the run goes the cold path and the pool starts keeping containers of
	// that key. A warm run is confined, checked and recorded exactly as a
	// cold one; its run directory is the slot's, under the pool's
	// directory. The pool must run on Sandbox and lease from UIDs; a run
	// without the self-check (Helpers or HelpersDir) always goes cold.
	WarmPool *warmpool.Pool
	// Labels are added to the run's container next to the dev.taskrun.*
	// labels, e.g. a test framework's session labels so its reaper finds it.
	Labels map[string]string
	// SessionExcludes are the glob patterns (relative to home) left out of
	// the session state; workspace.DefaultExcludes when nil.
	SessionExcludes []string
	// ChangeExcludes are the patterns (relative to home, in the syntax of
	// SessionExcludes) left out of the run's change set, so neither
	// changes.patch nor `taskrun apply` carries them:
	// changeset.DefaultExcludes (the reference agent's state) when nil,
	// nothing when empty. changes.json lists them.
	ChangeExcludes []string
	// KeepRunDir keeps the run directory on the host after a successful
	// run; by default it is removed once everything is persisted.
	KeepRunDir bool
	// MaxOutputBytes caps the stdout and the stderr kept from the run, each:
	// DefaultMaxOutputBytes when zero, no cap when negative. Output past the
	// cap is drained from the container and counted but not kept, so a
	// flooding agent cannot fill the host disk.
	MaxOutputBytes int64
	// DiskLimitBytes caps what the run may store under /taskrun:
	// DefaultDiskLimitBytes when zero, no cap when negative.
	DiskLimitBytes int64
	// Timeout bounds the container's run time; DefaultTimeout when zero.
	Timeout time.Duration
	// Stdout, when non-nil, receives a live copy of the run's stdout, fed
	// independently of StreamSender so neither can hold up the other.
	Stdout io.Writer
	// Stderr, when non-nil, receives the run's stderr live.
	Stderr io.Writer
	// Logger receives the executor's own log; slog.Default() when nil.
	Logger *slog.Logger

	// Journal records the run for crash recovery (package journal): by
	// default the journal under the runs root when Paths has one
	// (NewRuntimePathsFromRoot). A run ID with a record is refused.
	Journal *journal.Dir
	// Executor identifies the executor process in the journal.
	Executor instance.Info
	// AttestKey signs the run's attestation (package attest), stored as
	// attest.ObjectName beside the run's other objects. Without a key the
	// attestation is stored unsigned, and says so. The key stays in the
	// executor: it never enters the sandbox, a log or a record.
	AttestKey *attest.Signer
	// Version is the executor's version, recorded in the attestation.
	Version string
	// StoreURL and ControlPlane are journaled (without credentials) so
	// that `taskrun gc` can finish the run if the executor dies.
	StoreURL     string
	ControlPlane *journal.ControlPlane
	// PersistTimeout bounds storing the run's outputs:
	// DefaultPersistTimeout when zero.
	PersistTimeout time.Duration
	// ReportTimeout bounds the final report: DefaultReportTimeout when zero.
	ReportTimeout time.Duration
	// Timings, when set, records the run's phases (see package timings);
	// by default execute makes a Recorder. Either way the spans end up in
	// Outcome.Timings and in the run's index record.
	Timings *timings.Recorder
	// OnUsage, when set, is called with the run's resource usage so far
	// after each live sample of its container's counters (a backend with
	// sandbox.Capabilities.Stats), from the sampler's goroutine.
	OnUsage func(sandbox.Usage)
	// ShutdownGrace bounds, once ctx is cancelled, everything the run still
	// does (stopping the container, storing, reporting); what is left is in
	// the journal for `taskrun gc`. Zero: the deadlines above only.
	ShutdownGrace time.Duration

	// live registers the run's live container for Host.Pause; nil for a
	// run not executed by a Host.
	live *liveRuns
	// restore is the checkpoint the run is restored from (Host.Resume);
	// nil for a run that starts afresh.
	restore *restore
}

// Defaults applied to a zero Spec or Config field.
const (
	DefaultImage   = "taskrun/agent:local"
	DefaultTimeout = 30 * time.Minute
	// DefaultMaxOutputBytes is the default of Defaults.MaxOutputBytes.
	DefaultMaxOutputBytes = 1 << 30
	// MaxResultOutputBytes caps RunResult.Output. The complete output always
	// goes to blob storage as output.log.
	MaxResultOutputBytes = 1 << 20
	// MaxPatchOutputBytes caps the output sent in the final PATCH, so that
	// the body stays well under the control plane's 1 MiB limit even when
	// JSON escaping inflates it.
	MaxPatchOutputBytes = 128 << 10
	// TruncationMarker ends an output that was cut at MaxResultOutputBytes.
	TruncationMarker = "\n[taskrun: output truncated; the complete output is in output.log]\n"
)

// RunResult is what a finished run produced.
type RunResult struct {
	// EndTime is when the run ended, in unix milliseconds.
	EndTime int64 `json:"end_time"`
	// OutputStr is Output as a string.
	OutputStr string `json:"output_str"`
	// RunArtifactsDir is the host directory the agent's artifacts were
	// collected from; it is removed after a successful run unless KeepRunDir.
	RunArtifactsDir string `json:"run_artifacts_dir"`
	// Output is the run's stdout, capped at MaxResultOutputBytes with TruncationMarker.
	Output []byte `json:"-"`
	// PromptTokens and CompletionTokens are counted by the executor's model
	// gateway; nil when the run used no model.
	PromptTokens     *int `json:"prompt_tokens"`
	CompletionTokens *int `json:"completion_tokens"`
	// TracePath is the trace's key in run-global storage,
	// traces/<session>/rt_<agentRunID>.jsonl; empty when there is no trace
	// (with a model configured the executor creates it, so it is set).
	TracePath string `json:"trace_path"`
}
