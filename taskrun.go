// Package taskrun runs one AI agent on one task in a fresh, hardened container.
//
// RunTask is the whole of a run: it validates the input, materializes the run
// directory on the host, writes AGENTS.md, runs the agent in a sandbox with its
// stdout streamed as deltas, persists the output, session state, artifacts,
// trace and isolation record to blob storage, and reports the run's status
// through a TaskRunUpdater.
//
// This package is the seed's API and nothing more: every name here is an
// alias of, or a thin wrapper over, package executor, which holds the run
// pipeline and the long-lived executor.Host that services build once and
// hand each run to. New code that runs many runs on one host uses
// executor.New and Host.Run.
package taskrun

import (
	"context"

	"github.com/taskrun/taskrun/agentmd"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/warmpool"
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

// RunTaskInput is everything one run needs (executor.Input).
type RunTaskInput = executor.Input

// RunResult is what a finished run produced.
type RunResult = executor.RunResult

// RunTask executes one run end to end and reports it through input.Updater.
// It returns nil only when the run SUCCEEDED; otherwise a *RunError that
// matches ErrRunFailed.
func RunTask(ctx context.Context, input RunTaskInput) error {
	_, err := executor.Execute(ctx, input)
	return err
}

// Execute is RunTask that also returns the Outcome, for callers that present
// the result (the CLI) or need the container's exit code (executor.Execute).
func Execute(ctx context.Context, input RunTaskInput) (*Outcome, error) {
	return executor.Execute(ctx, input)
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
// kept (executor.RetryPersist).
func RetryPersist(ctx context.Context, input RunTaskInput) (*Outcome, error) {
	return executor.RetryPersist(ctx, input)
}

// WarmTemplate is the warm pool template of input's runs
// (executor.WarmTemplate).
func WarmTemplate(ctx context.Context, input RunTaskInput) (warmpool.Template, error) {
	return executor.WarmTemplate(ctx, input)
}

// OpenRunJournal opens the journal of the runs under root.
func OpenRunJournal(root string) (*journal.Dir, error) { return executor.OpenRunJournal(root) }

// PoolDir is the warm pool's directory under the runs root.
func PoolDir(root string) string { return executor.PoolDir(root) }
