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
	"crypto/x509"
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
// value, as the seed defined it. RunTask splits it into an executor.Config
// (the machine) and an executor.Spec (the run): a field documented there
// under the same name means the same here, with the same default when
// zero. Only what differs from those is documented below. With only the
// seed's fields a run is confined as `taskrun run`'s are: it leases a host
// uid of its own (UIDs) and starts with the in-sandbox self-check
// (Helpers), or it is refused, with a reason that names the fix;
// SharedUID and NoSelfCheck opt out, as `taskrun run --uid-range ""
// --helpers-dir ""` does.
type RunTaskInput struct {
	// The run: see the executor.Spec fields of the same names. Task, Run
	// and Updater are required.
	Task         *model.Task
	Run          *model.TaskRun
	SessionID    string
	Updater      TaskRunUpdater
	StreamSender workerclient.StreamSender
	Model        config.ModelEntry
	Egress       egress.Policy
	Image        string
	Command      []string
	Entrypoint   []string
	Env          []string
	// Policy confines the container; sandbox.DefaultPolicy() when zero
	// (executor.Spec.Policy is a pointer; a zero Policy here is nil there).
	Policy          sandbox.Policy
	Labels          map[string]string
	SessionExcludes []string
	ChangeExcludes  []string
	KeepRunDir      bool
	MaxOutputBytes  int64
	DiskLimitBytes  int64
	Timeout         time.Duration
	Stdout          io.Writer
	Stderr          io.Writer
	Timings         *timings.Recorder

	// Paths is the host layout of run directories (required). It must
	// know its runs root, as NewRuntimePathsFromRoot's does: the root is
	// executor.Config.Root, which holds the journal and the disk admission.
	Paths RuntimePaths
	// Persist and ArtifactStorage (both required) are executor.Config's
	// Store and Artifacts: Persist stores the run's files, ArtifactStorage
	// the files the agent delivers.
	Persist         persist.PersistStorage
	ArtifactStorage persist.ArtifactStorage
	// Sandbox is executor.Config.Backend: it runs the container, and
	// RunTask requires it.
	Sandbox sandbox.Backend

	// Helpers and HelpersDir are executor.Config's, with one difference:
	// with neither set the run uses the running program itself
	// (helpers.FromExecutable: this package makes any program that links it
	// serve as taskrun-probe and taskrun-relay), which must be statically
	// linked (CGO_ENABLED=0); otherwise the run is refused with
	// ErrInvalidInput before any container is made, unless NoSelfCheck is
	// set.
	Helpers    helpers.Files
	HelpersDir string
	// NoSelfCheck runs without the in-sandbox self-check when neither
	// Helpers nor HelpersDir is set, as `taskrun run --helpers-dir ""`
	// does: the isolation record then holds no report from inside. For a
	// backend that cannot run the helpers (a test's fake); a real run
	// should keep the check.
	NoSelfCheck bool
	// UIDs is executor.Config's, with one difference: when nil, as `taskrun
	// run` does, runs lease from WarmPool's uid pool when it has one, else
	// from uidpool.DefaultRange with the leases of the runs root
	// (executor.Layout.UIDLeaseDir), unless SharedUID is set.
	UIDs *uidpool.Pool
	// SharedUID runs every run as Policy.User (uid 10001 by default) when
	// UIDs is nil, as `taskrun run --uid-range ""` does: runs then share
	// the kernel's per-user limits.
	SharedUID bool

	// The machine: see the executor.Config fields of the same names.
	Pull           sandbox.PullPolicy
	AllowedImages  []string
	EgressRoots    *x509.CertPool
	WarmPool       *warmpool.Pool
	Logger         *slog.Logger
	Journal        *journal.Dir
	Executor       instance.Info
	AttestKey      *attest.Signer
	Version        string
	StoreURL       string
	ControlPlane   *journal.ControlPlane
	PersistTimeout time.Duration
	ReportTimeout  time.Duration
	ShutdownGrace  time.Duration
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
	return onHost(ctx, input, (*executor.Host).RetryPersist)
}

// WarmTemplate is the warm pool template of input's runs
// (executor.Host.WarmTemplate on input's machine).
func WarmTemplate(ctx context.Context, input RunTaskInput) (warmpool.Template, error) {
	// The template holds the helpers and uids its runs will have, so it
	// gets the same defaults a run does; RetryPersist starts no container.
	if err := input.check(false); err != nil {
		return warmpool.Template{}, err
	}
	input, err := input.secure()
	if err != nil {
		return warmpool.Template{}, err
	}
	return onHost(ctx, input, (*executor.Host).WarmTemplate)
}

// onHost calls do with input's spec on the executor.Host of input's
// machine, built for the call and closed after it, for what runs nothing
// (no Sandbox needed). Bad input is returned, not reported.
func onHost[T any](ctx context.Context, input RunTaskInput, do func(*executor.Host, context.Context, executor.Spec) (T, error)) (T, error) {
	var zero T
	if err := input.check(false); err != nil {
		return zero, err
	}
	host, err := input.host(ctx)
	if err != nil {
		return zero, err
	}
	defer host.Close(context.WithoutCancel(ctx))
	return do(host, ctx, input.spec())
}

// OpenRunJournal opens the journal of the runs under root.
func OpenRunJournal(root string) (*journal.Dir, error) { return executor.OpenRunJournal(root) }

// PoolDir is the warm pool's directory under the runs root.
func PoolDir(root string) string { return executor.PoolDir(root) }
