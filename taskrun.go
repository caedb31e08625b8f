// Package taskrun runs one AI agent on one task in a fresh, hardened container.
//
// RunTask is the whole of a run: it validates the input, materializes the run
// directory on the host, writes AGENTS.md, runs the agent in a sandbox with its
// stdout streamed as deltas, persists the output, session state, artifacts,
// trace and isolation record to blob storage, and reports the run's status
// through a TaskRunUpdater.
//
// This package is the seed's API and nothing more: every name here is an
// alias of package executor's, or a thin wrapper that splits a
// RunTaskInput into an executor.Config and an executor.Spec and runs it
// with executor.New and Host.Run. Package executor holds the run pipeline
// and the long-lived executor.Host that services build once and hand each
// run to; new code that runs many runs on one host uses it directly.
package taskrun

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/taskrun/taskrun/agentmd"
	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/executor"
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
	"github.com/taskrun/taskrun/workspace"
)

// RuntimePaths is the host layout of run directories.
type RuntimePaths = executor.RuntimePaths

// NewRuntimePathsFromRoot returns the standard layout under root:
// root/users/U/conversations/C/tasks/T/runs/R/{home,artifacts,global,output}.
func NewRuntimePathsFromRoot(root string) RuntimePaths { return workspace.NewPaths(root) }

// TaskRunUpdater reports a run's status to the control plane.
type TaskRunUpdater = executor.TaskRunUpdater

// BuildRunAgentsMdContent returns the run's AGENTS.md: the run-directory
// section first, then workspaceDir/AGENTS.md if present (see
// agentmd.BuildRunAgentsMdContent for which directory may be given).
func BuildRunAgentsMdContent(workspaceDir string) (string, error) {
	return agentmd.BuildRunAgentsMdContent(workspaceDir)
}

// WriteRunAgentsMd writes BuildRunAgentsMdContent(workspaceDir) to
// runDir/AGENTS.md.
func WriteRunAgentsMd(runDir, workspaceDir string) error {
	return agentmd.WriteRunAgentsMd(runDir, workspaceDir)
}

// RunTaskInput is everything one run needs, the machine and the run in one
// value, as the seed defined it. RunTask splits it: its machine fields
// become an executor.Config (Paths, Persist, ArtifactStorage, Sandbox,
// Pull, AllowedImages, Helpers, HelpersDir, UIDs, WarmPool, Logger,
// Journal, Executor, AttestKey, Version, StoreURL, ControlPlane and the
// timeouts), its run fields an executor.Spec. With only the seed's fields a
// run is confined as `taskrun run`'s are: it leases a host uid of its own
// (UIDs) and starts with the in-sandbox self-check (Helpers), or it is
// refused, with a reason that names the fix; SharedUID and NoSelfCheck opt
// out, as `taskrun run --uid-range "" --helpers-dir ""` does.
type RunTaskInput struct {
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
	// needs the relay among the helpers (see Helpers).
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
	// or the binary itself, which acts as the self-check and the relay.
	// Every run starts with the in-sandbox self-check; a contradiction with
	// Policy refuses the run. Exactly the helper files are mounted,
	// read-only, file by file under /.taskrun/bin. Set at most one of
	// Helpers and HelpersDir. With neither, as `taskrun run` does, the run
	// uses the running program itself (helpers.FromExecutable: this package
	// makes any program that links it serve as taskrun-probe and
	// taskrun-relay), which must be statically linked (CGO_ENABLED=0);
	// otherwise the run is refused with ErrInvalidInput, before any
	// container is made, unless NoSelfCheck is set.
	Helpers helpers.Files
	// HelpersDir holds separately built static helpers: taskrun-probe
	// (required) and taskrun-relay; only those files are mounted. `make
	// build` puts them in the checkout's bin/.
	HelpersDir string
	// NoSelfCheck runs without the in-sandbox self-check when neither
	// Helpers nor HelpersDir is set, as `taskrun run --helpers-dir ""`
	// does: the isolation record then holds no report from inside. For a
	// backend that cannot run the helpers (a test's fake); a real run
	// should keep the check.
	NoSelfCheck bool
	// UIDs leases each run a host uid/gid of its own: the container runs as
	// it (replacing Policy.User), the run directory is owned by it, and it
	// is released once the container is gone. Runs then never share
	// per-user kernel limits (inotify instances, processes). When nil, as
	// `taskrun run` does, runs lease from WarmPool's uid pool when it has
	// one, else from uidpool.DefaultRange with the leases of the runs root
	// (executor.Layout.UIDLeaseDir: shared by every executor of the host
	// when running as root), unless SharedUID is set.
	UIDs *uidpool.Pool
	// SharedUID runs every run as Policy.User (uid 10001 by default) when
	// UIDs is nil, as `taskrun run --uid-range ""` does: runs then share
	// the kernel's per-user limits.
	SharedUID bool
	// WarmPool, when set, starts the run in a container its pool parked
	// ahead of time (package warmpool), when one of the run's key (its
	// image, policy, helpers, disk cap, timeout and labels) is ready; else
	// the run goes the cold path and the pool starts keeping containers of
	// that key. A warm run is confined, checked and recorded exactly as a
	// cold one; its run directory is the slot's, under the pool's
	// directory. The pool must run on Sandbox and lease from UIDs; a run
	// without the self-check (NoSelfCheck) always goes cold.
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
	// by default the run makes a Recorder. Either way the spans end up in
	// Outcome.Timings and in the run's index record.
	Timings *timings.Recorder
	// ShutdownGrace bounds, once ctx is cancelled, everything the run still
	// does (stopping the container, storing, reporting); what is left is in
	// the journal for `taskrun gc`. Zero: the deadlines above only.
	ShutdownGrace time.Duration
}

// RunResult is what a finished run produced.
type RunResult = executor.RunResult

// RunTask executes one run end to end and reports it through input.Updater.
// It returns nil only when the run SUCCEEDED; otherwise a *RunError that
// matches ErrRunFailed.
func RunTask(ctx context.Context, input RunTaskInput) error {
	_, err := Execute(ctx, input)
	return err
}

// Execute is RunTask that also returns the Outcome, for callers that present
// the result (the CLI) or need the container's exit code. It builds the
// executor.Host of input's machine (executor.New) and runs input's spec on
// it (Host.Run). Input that no host could be built from is refused as
// executor.Host.Run refuses a bad spec: reported FAILED through
// input.Updater, with a *RunError wrapping ErrInvalidInput.
func Execute(ctx context.Context, input RunTaskInput) (*Outcome, error) {
	if err := input.check(true); err != nil {
		return refuse(ctx, input, err)
	}
	input, err := input.secure()
	if err != nil {
		return refuse(ctx, input, err)
	}
	host, err := input.host(ctx)
	if err != nil {
		return refuse(ctx, input, err)
	}
	defer host.Close(context.WithoutCancel(ctx))
	return host.Run(ctx, input.spec())
}

// Outcome is how a run ended, as seen by the executor.
type Outcome = executor.Outcome

// RunError is returned for a run that did not succeed; it matches
// ErrRunFailed.
type RunError = executor.RunError

// The errors a run's error wraps (see the executor's documentation of each).
var (
	ErrRunFailed          = executor.ErrRunFailed
	ErrInvalidInput       = executor.ErrInvalidInput
	ErrIsolation          = executor.ErrIsolation
	ErrDiskLimit          = executor.ErrDiskLimit
	ErrImageNotAllowed    = executor.ErrImageNotAllowed
	ErrOutputNotDelivered = executor.ErrOutputNotDelivered
	ErrNothingKept        = executor.ErrNothingKept
)

// Defaults applied to a zero RunTaskInput field, and the caps on a run's
// output (see executor's constants of the same names).
const (
	DefaultImage          = executor.DefaultImage
	DefaultTimeout        = executor.DefaultTimeout
	DefaultMaxOutputBytes = executor.DefaultMaxOutputBytes
	DefaultDiskLimitBytes = executor.DefaultDiskLimitBytes
	DefaultPersistTimeout = executor.DefaultPersistTimeout
	DefaultReportTimeout  = executor.DefaultReportTimeout
	MaxResultOutputBytes  = executor.MaxResultOutputBytes
	TruncationMarker      = executor.TruncationMarker
)

// Names of a run's objects in PersistStorage, and of the executors'
// directory under the runs root (see executor).
const (
	OutputLogName        = executor.OutputLogName
	StderrLogName        = executor.StderrLogName
	SessionStateName     = executor.SessionStateName
	ResultPrefix         = executor.ResultPrefix
	AuditRecordName      = executor.AuditRecordName
	CollectionRecordName = executor.CollectionRecordName
	ChangesPatchName     = executor.ChangesPatchName
	ChangesListName      = executor.ChangesListName
	ExecutorsDirName     = executor.ExecutorsDirName
)

// CollectionRecord is the run object CollectionRecordName.
type CollectionRecord = executor.CollectionRecord

// SkippedFile is a file of the agent's that the run did not store.
type SkippedFile = executor.SkippedFile

// RetryPersist finishes a run whose storing failed from the local copy it
// kept (executor.Host.RetryPersist on input's machine); input names the
// same run, and its Sandbox, Image and Model are unused. Bad input is
// returned, not reported.
func RetryPersist(ctx context.Context, input RunTaskInput) (*Outcome, error) {
	if err := input.check(false); err != nil {
		return nil, err
	}
	host, err := input.host(ctx)
	if err != nil {
		return nil, err
	}
	defer host.Close(context.WithoutCancel(ctx))
	return host.RetryPersist(ctx, input.spec())
}

// WarmTemplate is the warm pool template of input's runs
// (executor.Host.WarmTemplate on input's machine).
func WarmTemplate(ctx context.Context, input RunTaskInput) (warmpool.Template, error) {
	if err := input.check(false); err != nil {
		return warmpool.Template{}, err
	}
	input, err := input.secure()
	if err != nil {
		return warmpool.Template{}, err
	}
	host, err := input.host(ctx)
	if err != nil {
		return warmpool.Template{}, err
	}
	defer host.Close(context.WithoutCancel(ctx))
	return host.WarmTemplate(ctx, input.spec())
}

// OpenRunJournal opens the journal of the runs under root.
func OpenRunJournal(root string) (*journal.Dir, error) { return executor.OpenRunJournal(root) }

// PoolDir is the warm pool's directory under the runs root.
func PoolDir(root string) string { return executor.PoolDir(root) }
