package taskrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/probe"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workspace"
)

// Outcome is how a run ended, as seen by the executor.
type Outcome struct {
	// Status is the final status reported to the control plane.
	Status model.RunStatus `json:"status"`
	// Reason explains a status other than SUCCEEDED.
	Reason string `json:"reason,omitempty"`
	// Exit is the container's result; zero when no container ran.
	Exit sandbox.Result `json:"exit"`
	// ContainerID is the container that ran the agent.
	ContainerID string `json:"container_id,omitempty"`
	// Result is the seed's run result.
	Result RunResult `json:"result"`
	// Artifacts are the stored artifacts, in path order.
	Artifacts []persist.ObjectInfo `json:"artifacts,omitempty"`
	// DroppedOutputBytes counts stdout and stderr bytes past MaxOutputBytes,
	// drained from the container but not kept.
	DroppedOutputBytes int64 `json:"dropped_output_bytes,omitempty"`
	// Stored lists every object the run stored: logs, artifacts, output
	// files, the trace, session state and the isolation record.
	Stored []persist.ObjectInfo `json:"stored,omitempty"`
}

// ErrRunFailed matches (errors.Is) the *RunError that RunTask returns for a
// run that ended in FAILED or CANCELLED.
var ErrRunFailed = errors.New("run failed")

// ErrInvalidInput is wrapped by errors about RunTaskInput itself.
var ErrInvalidInput = errors.New("invalid run input")

// RunTask executes one run end to end and reports it through input.Updater.
// It returns nil only when the run SUCCEEDED.
func RunTask(ctx context.Context, input RunTaskInput) error {
	_, err := Execute(ctx, input)
	return err
}

// Execute is RunTask that also returns the Outcome, for callers that present
// the result (the CLI) or need the container's exit code.
func Execute(ctx context.Context, input RunTaskInput) (*Outcome, error) {
	r, err := newRunner(input)
	if err == nil && input.Sandbox == nil {
		err = fmt.Errorf("%w: Sandbox is required", ErrInvalidInput)
	}
	if err == nil {
		err = r.preflight(ctx)
	}
	if err != nil {
		return r.failEarly(ctx, err)
	}
	return r.run(ctx)
}

// runner carries one run's state through its steps.
type runner struct {
	in     RunTaskInput
	log    *slog.Logger
	ref    persist.RunRef
	dirs   workspace.RunDirs
	policy sandbox.Policy
	// hostDir holds executor-private files (output spools): beside the run
	// directory, never inside the bind mount, so the agent cannot touch them.
	hostDir string
	out     Outcome
	started time.Time
	// runningReported is closed once the RUNNING PATCH was sent (or gave up).
	runningReported <-chan struct{}
	// ownsRunDir is set once this run created its directory; only then may
	// it remove it. A reused run ID must never touch the first run's files.
	ownsRunDir bool
	// unmountDisk releases the run dir's size-capped filesystem, if mounted.
	unmountDisk func() error
	// iso, probeReport and probeContradictions are the run's isolation
	// checks and what the in-sandbox self-check saw.
	iso                 *isolation
	probeReport         *probe.Report
	probeContradictions []string
}

func newRunner(in RunTaskInput) (*runner, error) {
	r := &runner{in: in, log: in.Logger}
	if r.log == nil {
		r.log = slog.Default()
	}
	if err := validateInput(in); err != nil {
		return r, err
	}
	r.log = r.log.With("run", in.Run.ID, "task", in.Task.ID, "user", in.Task.UserID)
	r.ref = persist.RunRef{UserID: in.Task.UserID, ConversationID: in.Task.ConversationID, TaskID: in.Task.ID, RunID: in.Run.ID}
	r.dirs = workspace.RunDirs{
		Dir:       in.Paths.RuntimeTaskRunDir(r.ref.UserID, r.ref.ConversationID, r.ref.TaskID, r.ref.RunID),
		Home:      in.Paths.RuntimeTaskRunHomeDir(r.ref.UserID, r.ref.ConversationID, r.ref.TaskID, r.ref.RunID),
		Artifacts: in.Paths.RuntimeTaskRunArtifactsDir(r.ref.UserID, r.ref.ConversationID, r.ref.TaskID, r.ref.RunID),
		Global:    in.Paths.RuntimeTaskRunGlobalDir(r.ref.UserID, r.ref.ConversationID, r.ref.TaskID, r.ref.RunID),
		Output:    in.Paths.RunOutputDir(r.ref.UserID, r.ref.ConversationID, r.ref.TaskID, r.ref.RunID),
	}
	r.hostDir = r.dirs.Dir + ".executor"
	r.policy = in.Policy
	if r.policy == (sandbox.Policy{}) {
		r.policy = sandbox.DefaultPolicy()
	}
	if err := r.policy.Validate(); err != nil {
		return r, fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	return r, nil
}

// preflight refuses a run whose self-check or image is missing before
// anything is written.
func (r *runner) preflight(ctx context.Context) error {
	if _, err := r.probePath(); err != nil {
		return err
	}
	if c, ok := r.in.Sandbox.(sandbox.ImageChecker); ok {
		return c.CheckImage(ctx, r.spec().Image)
	}
	return nil
}

// validateInput refuses bad input before anything touches disk or Docker.
func validateInput(in RunTaskInput) error {
	var errs []error
	missing := func(cond bool, what string) {
		if cond {
			errs = append(errs, fmt.Errorf("%w: %s is required", ErrInvalidInput, what))
		}
	}
	missing(in.Task == nil, "Task")
	missing(in.Run == nil, "Run")
	missing(in.Paths == nil, "Paths")
	missing(in.Persist == nil, "Persist")
	missing(in.ArtifactStorage == nil, "ArtifactStorage")
	missing(in.Updater == nil, "Updater")
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	ids := []struct{ kind, id string }{
		{"user", in.Task.UserID}, {"conversation", in.Task.ConversationID},
		{"task", in.Task.ID}, {"run", in.Run.ID}, {"session", in.SessionID},
	}
	if in.Run.PreviousRunID != "" {
		ids = append(ids, struct{ kind, id string }{"previous run", in.Run.PreviousRunID})
	}
	for _, id := range ids {
		if err := model.ValidateID(id.kind, id.id); err != nil {
			errs = append(errs, err)
		}
	}
	if in.Run.TaskID != "" && in.Run.TaskID != in.Task.ID {
		errs = append(errs, fmt.Errorf("%w: run %q belongs to task %q, not %q", ErrInvalidInput, in.Run.ID, in.Run.TaskID, in.Task.ID))
	}
	if dir := in.Task.WorkspaceDir; dir != "" {
		if info, err := os.Stat(dir); err != nil || !info.IsDir() {
			errs = append(errs, fmt.Errorf("%w: workspace %q is not a directory; pass an existing directory with --workspace", ErrInvalidInput, dir))
		}
	}
	return errors.Join(errs...)
}

// failEarly reports a run refused before it touched disk or Docker: FAILED,
// or CANCELLED when the caller cancelled meanwhile. The PATCH is sent only
// when the run ID itself is valid, since it names the URL, and on a context
// of its own so that a cancellation cannot swallow it.
func (r *runner) failEarly(ctx context.Context, cause error) (*Outcome, error) {
	status := model.StatusFailed
	if ctx.Err() != nil {
		status = model.StatusCancelled
	}
	r.out = Outcome{Status: status, Reason: cause.Error()}
	r.out.Result.EndTime = time.Now().UnixMilli()
	in := r.in
	if in.Updater != nil && in.Run != nil && model.ValidateID("run", in.Run.ID) == nil {
		reportCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := in.Updater.UpdateRunStatus(reportCtx, in.Run.ID, r.patch()); err != nil {
			cause = errors.Join(cause, fmt.Errorf("report %s: %w", status, err))
		}
	}
	return &r.out, &RunError{Status: status, Reason: r.out.Reason, Err: cause}
}

// patch builds the PATCH body for the current outcome.
func (r *runner) patch() *workerclient.PatchTaskRunRequest {
	res := r.out.Result
	req := &workerclient.PatchTaskRunRequest{
		Status:           r.out.Status,
		EndedAt:          ptr(res.EndTime),
		PromptTokens:     res.PromptTokens,
		CompletionTokens: res.CompletionTokens,
	}
	if !r.started.IsZero() {
		req.StartedAt = ptr(r.started.UnixMilli())
	}
	if res.Output != nil {
		out, cut := capOutput(res.Output, MaxPatchOutputBytes)
		req.Output = ptr(string(out))
		req.OutputTruncated = cut
	}
	if r.out.Reason != "" {
		req.Error = ptr(r.out.Reason)
	}
	if r.out.ContainerID != "" {
		req.ExitCode = ptr(r.out.Exit.ExitCode)
		req.Container = r.containerInfo()
	}
	if res.TracePath != "" {
		req.TracePath = ptr(res.TracePath)
	}
	return req
}

// containerInfo describes the run's container for the control plane.
func (r *runner) containerInfo() *workerclient.ContainerInfo {
	info := &workerclient.ContainerInfo{ID: r.out.ContainerID, Runtime: r.policy.Runtime}
	if r.iso != nil && r.iso.posture != nil {
		info.ImageDigest = r.iso.posture.Image
		info.Runtime = r.iso.posture.Runtime
	}
	return info
}

func ptr[T any](v T) *T { return &v }
