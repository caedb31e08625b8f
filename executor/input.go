package executor

import (
	"context"
	"crypto/x509"
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
// run itself. Host.runInput composes it from the host's Config and a Spec,
// with the host's defaults in the Spec's zero fields; the phases read it
// through the run's plan. Each field means what the Spec or Config field
// of the same name does; only the ones named differently there, or
// resolved by the host, are documented here.
type runInput struct {
	// root is Config.Root: the journal (without Journal) and the disk
	// admission live under it. Host sets it; only a phase test's input
	// may leave it empty, and then neither is done.
	root string

	// The run (Spec).
	Task            *model.Task
	Run             *model.TaskRun
	SessionID       string
	Updater         TaskRunUpdater
	StreamSender    workerclient.StreamSender
	Model           config.ModelEntry
	Egress          egress.Policy
	Image           string
	Command         []string
	Entrypoint      []string
	Env             []string
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
	OnUsage         func(sandbox.Usage)
	// Policy is Spec.Policy, else the host's default
	// (sandbox.DefaultPolicy() when zero).
	Policy sandbox.Policy

	// The machine (Config).
	Pull           sandbox.PullPolicy
	AllowedImages  []string
	EgressRoots    *x509.CertPool
	Helpers        helpers.Files
	HelpersDir     string
	UIDs           *uidpool.Pool
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
	// Paths places the run directories: Config.Paths, else the layout's.
	Paths RuntimePaths
	// Persist is Config.Store and ArtifactStorage Config.Artifacts, else
	// Store; both fenced by a Spec.Lease that confirms.
	Persist         persist.PersistStorage
	ArtifactStorage persist.ArtifactStorage
	// Sandbox is Config.Backend.
	Sandbox sandbox.Backend
	// WarmPool is the host's pool: Config.WarmPool, or the one Config.Warm
	// started.
	WarmPool *warmpool.Pool

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
