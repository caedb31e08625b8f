// Package taskruntest lets a Go test start a run under taskrun's sandbox
// policy and read what it produced, next to the containers of a
// testcontainers-go suite.
//
// A run goes through executor.Host.Run exactly as in production: a fresh
// hardened container from the Docker engine named by DOCKER_HOST, its output
// spooled and streamed, its files persisted to a file:// blob store in a
// temporary directory, and its status reported to a recording updater that
// the Result exposes.
//
// Every container a run creates carries testcontainers' session labels
// (testcontainers.GenericLabels: org.testcontainers=true, .lang, .version,
// .sessionId, and .reap=true when Ryuk is enabled), so that where Ryuk runs it
// reaps a run container left behind by a test process that died. Each Env
// also labels its containers dev.taskrun.test=<env ID> and removes whatever
// still carries that label when it closes.
//
// Ryuk: this package never starts testcontainers' reaper itself (runs go
// through taskrun's own Docker backend, and BuildImage builds without it),
// but testcontainers-go starts it, pulling the testcontainers/ryuk image
// from Docker Hub, with the first container or network a suite creates
// through testcontainers (GenericContainer and the modules), unless
// TESTCONTAINERS_RYUK_DISABLED=true. Where that image cannot be pulled (no
// registry, a rate limit), set TESTCONTAINERS_RYUK_DISABLED=true in the
// environment or in TestMain before anything starts: every Env still
// removes its containers when it closes, and only a test process that dies
// leaves any behind (remove them with RemoveContainers and LabelEnv).
//
// Runs are as secure as `taskrun run`'s by default: each run's agent has a
// host uid of its own (uidpool.DefaultRange, leased under the Env's run
// root) and starts behind the in-sandbox self-check, with the static
// helpers of EnvOptions.HelpersDir, else of $TASKRUN_BIN_DIR (`make build`
// puts taskrun-probe and taskrun-relay in bin/), else the test binary
// itself when it is static (CGO_ENABLED=0); otherwise NewEnv refuses with
// the fix. EnvOptions.SharedUID and NoSelfCheck opt out, as
// `taskrun run --uid-range "" --helpers-dir ""` do. The helpers also carry
// a run's egress (Options.Egress: the allow-list, brokered credentials and
// budgets of `--allow`, `--credential` and `--egress-policy`) and its model
// (Options.Model, reached through taskrun-relay).
//
//	func TestMyAgent(t *testing.T) {
//		res, err := taskruntest.Run(ctx, t, taskruntest.Options{
//			Image: "my/agent:dev", Cmd: []string{"my-agent"}, Workspace: "testdata/ws",
//		})
//		require.NoError(t, err)
//		report, err := res.Artifact(ctx, "report.md")
//		...
//	}
package taskruntest

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// Defaults of a run's identity and bounds.
const (
	// DefaultTimeout bounds a run whose Options set no Timeout.
	DefaultTimeout = 2 * time.Minute
	// DefaultTaskID, DefaultSessionID and UserID place runs in the store.
	DefaultTaskID    = "task"
	DefaultSessionID = "session"
	UserID           = "test-user"
	// ConversationID is the conversation every run of an Env belongs to.
	ConversationID = "conversation"
	// LabelEnv is the label that ties a container to the Env that created it.
	LabelEnv = "dev.taskrun.test"
	// HelpersDirEnv names a directory of static helpers an EnvOptions
	// without HelpersDir uses.
	HelpersDirEnv = "TASKRUN_BIN_DIR"
)

// ErrBadOptions is wrapped by errors about Options themselves.
var ErrBadOptions = errors.New("taskruntest: bad options")

// Options describe one run.
type Options struct {
	// Image is the run image, NAME[:TAG] or NAME@sha256:DIGEST.
	Image string
	// Pull says when the image is pulled from its registry, with the
	// credentials of the docker config (DOCKER_CONFIG, ~/.docker): unlike
	// taskrun run, the zero value is sandbox.PullNever, so a test reaches
	// no registry unless it asks; sandbox.PullMissing or PullAlways pull.
	Pull sandbox.PullPolicy
	// AllowedImages, when non-empty, refuses any other image before it is
	// pulled (executor.Config.AllowedImages).
	AllowedImages []string
	// Cmd replaces the image's default command when non-empty.
	Cmd []string
	// Entrypoint replaces the image's entrypoint, as `taskrun run
	// --entrypoint`: Cmd are then its arguments.
	Entrypoint []string
	// Egress lets the run reach the hosts its rules allow through its
	// egress proxy, with the credentials it brokers (read from this
	// process's environment or files, never entering the sandbox) and its
	// budgets: what `taskrun run --allow`, `--credential` and
	// `--egress-policy` give (egress.BuildPolicy parses those flags).
	// Zero: no network at all. It needs the helpers (not NoSelfCheck).
	Egress egress.Policy
	// Env adds NAME=VALUE variables to the agent's environment (visible to
	// it: no secrets); names taskrun sets itself are refused.
	Env []string
	// Workspace is a host directory copied into the run's home.
	Workspace string
	// Prompt is the task's instruction, readable at $TASKRUN_PROMPT_FILE.
	Prompt string
	// Model is the model the agent reaches through the run's gateway
	// (with its MaxTokens and MaxRequests budgets), at OPENAI_BASE_URL and
	// ANTHROPIC_BASE_URL of a command run behind taskrun-relay.
	Model config.ModelEntry
	// Policy confines the container; sandbox.DefaultPolicy() when zero.
	Policy sandbox.Policy
	// Timeout stops the run after this long; DefaultTimeout when zero.
	Timeout time.Duration
	// TaskID and SessionID default to DefaultTaskID and DefaultSessionID.
	TaskID, SessionID string
	// RunID names the run; generated when empty.
	RunID string
	// ResumeFrom is the ID of an earlier run of the same Env and task whose
	// session state this run continues.
	ResumeFrom string
	// Labels are added to the container next to the session labels.
	Labels map[string]string
	// Stdout, when non-nil, receives a live copy of the run's stdout.
	Stdout io.Writer
}

// Result is what a run produced, as the control plane and the store saw it.
type Result struct {
	// RunID and Ref name the run.
	RunID string
	Ref   persist.RunRef
	// Status is the final reported status; Reason explains a failure.
	Status model.RunStatus
	Reason string
	// ExitCode is the container's exit code (-1 when none ran).
	ExitCode int
	// Stream is every stdout byte the stream sender received, in order, and
	// StreamEnded whether the end of the stream was announced.
	Stream      []byte
	StreamEnded bool
	// Patches are the status updates sent, in order.
	Patches []workerclient.PatchTaskRunRequest
	// Labels are the labels the run asked for on its container.
	Labels map[string]string
	// Outcome is taskrun's own account of the run.
	Outcome *executor.Outcome

	store *persist.Store
}

// Final returns the last status update sent.
func (r *Result) Final() workerclient.PatchTaskRunRequest {
	if len(r.Patches) == 0 {
		return workerclient.PatchTaskRunRequest{}
	}
	return r.Patches[len(r.Patches)-1]
}

// RunFile reads a stored run file, e.g. executor.OutputLogName.
func (r *Result) RunFile(ctx context.Context, name string) ([]byte, error) {
	return readAll(r.store.OpenRunFile(ctx, r.Ref, name))
}

// Artifact reads a stored artifact by its path under artifacts/.
func (r *Result) Artifact(ctx context.Context, relPath string) ([]byte, error) {
	return readAll(r.store.OpenArtifact(ctx, r.Ref, relPath))
}

// AuditRecord reads the run's stored isolation record: the container's
// posture, the self-check's report from inside (Probe, nil without the
// self-check) and the egress totals.
func (r *Result) AuditRecord(ctx context.Context) (audit.Record, error) {
	raw, err := r.RunFile(ctx, executor.AuditRecordName)
	if err != nil {
		return audit.Record{}, err
	}
	return audit.ParseRecord(raw)
}

// Trace reads the run's stored trace; it wraps persist.ErrNotFound when the
// run wrote none.
func (r *Result) Trace(ctx context.Context) ([]byte, error) {
	path := r.Outcome.Result.TracePath
	if path == "" {
		return nil, fmt.Errorf("run %s stored no trace: %w", r.RunID, persist.ErrNotFound)
	}
	return readAll(r.store.OpenGlobalFile(ctx, UserID, path))
}

func readAll(rc io.ReadCloser, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// Env is a place for runs: a Docker backend, a file:// store and a run root
// under one directory. It is safe for concurrent runs.
type Env struct {
	id  string
	env *runtest.Env
}

// EnvOptions describe the machine of an Env: what `taskrun run`'s host
// flags give.
type EnvOptions struct {
	// Dir holds the store and the run directories; an absolute path,
	// e.g. t.TempDir().
	Dir string
	// HelpersDir is a directory of static taskrun-probe and taskrun-relay
	// (`taskrun run --helpers-dir`); empty: $TASKRUN_BIN_DIR, else the test
	// binary itself when it is static.
	HelpersDir string
	// NoSelfCheck runs without the in-sandbox self-check and its helpers,
	// as `taskrun run --helpers-dir ""`: no Egress, no relay.
	NoSelfCheck bool
	// SharedUID runs every run as uid 10001, as `taskrun run --uid-range ""`.
	SharedUID bool
	// EgressRoots are the roots the egress proxy verifies brokered hosts
	// with (`taskrun run --egress-ca`, egress.LoadUpstreamRoots); nil: the
	// host's system roots.
	EgressRoots *x509.CertPool
}

// NewEnv opens an Env whose store and run directories live under dir, with
// the secure defaults of EnvOptions. The Docker engine is found through
// DOCKER_HOST and friends.
func NewEnv(ctx context.Context, dir string) (*Env, error) {
	return OpenEnv(ctx, EnvOptions{Dir: dir})
}

// OpenEnv opens an Env of the machine opts describe.
func OpenEnv(ctx context.Context, opts EnvOptions) (*Env, error) {
	if !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("%w: dir %q must be an absolute path, e.g. t.TempDir()", ErrBadOptions, opts.Dir)
	}
	ro := runtest.Options{
		Dir: opts.Dir, Tenant: UserID, ConversationID: ConversationID, TaskID: DefaultTaskID, SessionID: DefaultSessionID,
		UIDPerRun: !opts.SharedUID, EgressRoots: opts.EgressRoots,
	}
	if !opts.NoSelfCheck {
		ro.HelpersDir = cmp.Or(opts.HelpersDir, os.Getenv(HelpersDirEnv))
		if ro.HelpersDir == "" {
			files, err := helpers.FromExecutable(filepath.Join(opts.Dir, "helpers"))
			if err != nil {
				return nil, fmt.Errorf("%w: the in-sandbox self-check has no helpers: %w; set EnvOptions.HelpersDir or $%s to a directory of static taskrun-probe and taskrun-relay (`make build` puts them in bin/, BuildStatic builds them), run the tests with CGO_ENABLED=0 so the test binary serves as its own, or set NoSelfCheck", ErrBadOptions, err, HelpersDirEnv)
			}
			ro.Helpers = files
		}
	}
	env, err := runtest.Open(ctx, ro)
	if err != nil {
		return nil, err
	}
	return &Env{id: "taskruntest-" + runtest.RandomID(), env: env}, nil
}

// ID is the value of LabelEnv on the Env's containers.
func (e *Env) ID() string { return e.id }

// Root is the host directory holding the run directories.
func (e *Env) Root() string { return e.env.Root }

// RunDir is the host directory of a run, mounted at /taskrun in its
// container; its home is RunDir/home.
func (e *Env) RunDir(taskID, runID string) string {
	return e.env.Paths().RuntimeTaskRunDir(UserID, ConversationID, taskID, runID)
}

// Labels returns the labels a run with extra labels puts on its container:
// testcontainers' session labels, LabelEnv and extra.
func (e *Env) Labels(extra map[string]string) map[string]string {
	labels := testcontainers.GenericLabels()
	maps.Copy(labels, extra)
	labels[LabelEnv] = e.id
	return labels
}

// Run executes one run and returns what it produced. The error is
// executor.Host.Run's: nil only for a SUCCEEDED run, matching
// executor.ErrRunFailed for a run that failed or was cancelled, in which case
// the Result is still complete.
func (e *Env) Run(ctx context.Context, opts Options) (*Result, error) {
	if opts.Image == "" {
		return nil, fmt.Errorf("%w: Image is required: name an image such as taskrun/testbox:local", ErrBadOptions)
	}
	host, done, err := e.host(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer done()
	rec := &controlplanetest.Recorder{}
	spec := e.spec(opts, rec)
	out, err := host.Run(ctx, spec)
	if out == nil {
		return nil, err
	}
	res := &Result{
		RunID:    spec.Run.ID,
		Ref:      persist.RunRef{UserID: UserID, ConversationID: ConversationID, TaskID: spec.Task.ID, RunID: spec.Run.ID},
		Status:   out.Status,
		Reason:   out.Reason,
		ExitCode: -1,
		Labels:   spec.Labels,
		Outcome:  out,
		store:    e.env.Store,
	}
	if out.ContainerID != "" {
		res.ExitCode = out.Exit.ExitCode
	}
	res.Stream, res.StreamEnded, _ = rec.Stream()
	res.Patches = rec.Patches()
	return res, err
}

// host is the executor host opts run on: the Env's, or, for a pull policy
// or image rules of their own, one built for the run from the Env's
// configuration; done releases it.
func (e *Env) host(ctx context.Context, opts Options) (*executor.Host, func(), error) {
	if (opts.Pull == "" || opts.Pull == sandbox.PullNever) && len(opts.AllowedImages) == 0 {
		return e.env.Host, func() {}, nil
	}
	cfg := e.env.Config
	cfg.Pull, cfg.AllowedImages = opts.Pull, opts.AllowedImages
	host, err := executor.New(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("taskruntest: %w", err)
	}
	return host, func() { _ = host.Close(context.WithoutCancel(ctx)) }, nil
}

// spec builds the executor.Spec of opts.
func (e *Env) spec(opts Options, rec *controlplanetest.Recorder) executor.Spec {
	s := e.env.Spec(defaultString(opts.RunID, "run-"+runtest.RandomID()), opts.Image, opts.Cmd...)
	taskID := defaultString(opts.TaskID, DefaultTaskID)
	s.Task.ID, s.Run.TaskID = taskID, taskID
	s.Task.Prompt, s.Task.WorkspaceDir = opts.Prompt, opts.Workspace
	s.Run.PreviousRunID = opts.ResumeFrom
	s.SessionID = defaultString(opts.SessionID, DefaultSessionID)
	s.Updater, s.StreamSender = rec, rec
	s.Model, s.Env, s.Egress, s.Entrypoint = opts.Model, opts.Env, opts.Egress, opts.Entrypoint
	if opts.Policy != (sandbox.Policy{}) {
		s.Policy = &opts.Policy
	}
	s.Labels = e.Labels(opts.Labels)
	s.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	s.Stdout = opts.Stdout
	return s
}

// Close removes every container still carrying the Env's label and releases
// the backend and the store. The directory is left to its owner.
func (e *Env) Close(ctx context.Context) error {
	return errors.Join(RemoveContainers(ctx, map[string]string{LabelEnv: e.id}), e.env.Close())
}

// Run executes one run in an Env under tb.TempDir() that is closed at
// tb's cleanup. See Env.Run.
func Run(ctx context.Context, tb testing.TB, opts Options) (*Result, error) {
	tb.Helper()
	env, err := NewEnv(ctx, tb.TempDir())
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() {
		if err := env.Close(context.WithoutCancel(ctx)); err != nil {
			tb.Errorf("taskruntest: close env: %v", err)
		}
	})
	return env.Run(ctx, opts)
}

// RemoveContainers force-removes every container that carries all of labels.
// An empty label set is refused: it would match every container.
func RemoveContainers(ctx context.Context, labels map[string]string) error {
	if len(labels) == 0 {
		return fmt.Errorf("%w: RemoveContainers needs at least one label", ErrBadOptions)
	}
	return runtest.RemoveContainers(ctx, labels)
}

func defaultString(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
