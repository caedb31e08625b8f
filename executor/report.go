package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workerclient"
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
	// Image is the image reference the run asked for; ImageDigest names
	// the image it used: the repo digest (name@sha256:...) when the image
	// came from a registry, else its image ID. ImageDigest is empty when
	// the image was never resolved.
	Image       string `json:"image,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	// Result is the seed's run result.
	Result RunResult `json:"result"`
	// Artifacts are the stored artifacts, in path order.
	Artifacts []persist.ObjectInfo `json:"artifacts,omitempty"`
	// DroppedOutputBytes counts stdout and stderr bytes past MaxOutputBytes,
	// drained from the container but not kept.
	DroppedOutputBytes int64 `json:"dropped_output_bytes,omitempty"`
	// Stored lists every object the run stored: logs, artifacts, output
	// files, the trace, the change set, session state and the isolation
	// record.
	Stored []persist.ObjectInfo `json:"stored,omitempty"`
	// Changes names the stored change set (changes.patch, changes.json)
	// and summarises it; nil when the run has none.
	Changes *workerclient.ChangeSet `json:"changes,omitempty"`
	// Skipped lists the agent's files that were not stored, with the reason
	// (the first workspace.MaxSkips; DroppedSkips counts the others); the
	// run's CollectionRecordName object holds the same list.
	Skipped      []SkippedFile `json:"skipped,omitempty"`
	DroppedSkips int64         `json:"dropped_skips,omitempty"`
	// DroppedRecordBytes counts bytes of the host-side records (spools,
	// trace lines, gateway record) refused by the run's record budget.
	DroppedRecordBytes int64 `json:"dropped_record_bytes,omitempty"`
	// Usage is what the container used (CPU time, peak memory, block I/O,
	// peak pids), sampled from its cgroup while it ran; nil when no
	// container ran or its backend samples none (Capabilities.Stats).
	Usage *sandbox.Usage `json:"usage,omitempty"`
	// Checkpoint is the checkpoint a PAUSED run's sandbox was stored as:
	// Host.Resume needs it, and checks the stored archive against it.
	Checkpoint *checkpoint.Manifest `json:"checkpoint,omitempty"`
	// Timings are the run's phases and how long each took, in order of
	// their start; overlapping phases ran concurrently.
	Timings []timings.Span `json:"timings,omitempty"`
}

// RunError is returned for a run that did not succeed. It matches
// ErrRunFailed with errors.Is, and the causes (sandbox.ErrImageNotFound, a
// persist error, ...) through Err.
type RunError struct {
	// Status is FAILED or CANCELLED.
	Status model.RunStatus
	// Reason is the reason reported to the control plane.
	Reason string
	// Err holds the underlying errors, if any.
	Err error
}

func (e *RunError) Error() string { return fmt.Sprintf("run %s: %s", e.Status, e.Reason) }

// Unwrap returns ErrRunFailed and the underlying errors.
func (e *RunError) Unwrap() []error { return []error{ErrRunFailed, e.Err} }

// verdict is how the run ended before anything was persisted.
type verdict struct {
	status model.RunStatus
	reason string
	// err is the first failure of preparing or supervising the run.
	err   error
	ended time.Time
}

// judge maps what prepare and supervise returned to a verdict.
func judge(ctx context.Context, p *plan, ex execution, runErr error) verdict {
	v := verdict{status: model.StatusSucceeded, err: runErr, ended: time.Now()}
	exit := ex.Exit
	switch {
	case ctx.Err() != nil:
		v.status, v.reason = model.StatusCancelled, cancelReason(ctx)
	case runErr != nil:
		v.status, v.reason = model.StatusFailed, runErr.Error()
	case exit.TimedOut:
		v.status, v.reason = model.StatusFailed, fmt.Sprintf("timed out after %s", p.spec.Timeout)
	case exit.OOMKilled:
		v.status, v.reason = model.StatusFailed, fmt.Sprintf("out of memory: the container exceeded its %d MiB limit", p.policy.MemoryBytes>>20)
	case exit.Cancelled:
		v.status, v.reason = model.StatusCancelled, "run cancelled"
	case exit.ExitCode != 0 && ex.ModelUpstream != "":
		// The agent failed because its model did: say which.
		v.status, v.reason = model.StatusFailed, fmt.Sprintf("%s (the agent exited with code %d)", ex.ModelUpstream, exit.ExitCode)
	case exit.ExitCode != 0 && ex.ReadOnlyRootWrite:
		v.status, v.reason = model.StatusFailed, fmt.Sprintf("agent exited with code %d; its stderr reports a write to a read-only file system: "+
			"the root filesystem is read-only, so an agent image may write only under /taskrun/home ($HOME) and /tmp (see \"What an agent image needs\" in the README)", exit.ExitCode)
	case (exit.ExitCode == 126 || exit.ExitCode == 127) && len(p.helpers) == 0:
		// Without the self-check, the init process reports a command it
		// could not exec with these codes, as a shell does.
		v.status, v.reason = model.StatusFailed, fmt.Sprintf("agent exited with code %d: the command could not be found or executed in the image, or itself exited so; "+
			"an agent image needs its command readable and executable by any uid (runs use a uid of their own), and the self-check (helpers) names the exact cause (see \"What an agent image needs\" in the README)", exit.ExitCode)
	case exit.ExitCode != 0:
		v.status, v.reason = model.StatusFailed, fmt.Sprintf("agent exited with code %d", exit.ExitCode)
	}
	return v
}

// cancelReason is "run cancelled", followed by the cause the caller gave
// when it cancelled ctx with one (context.WithCancelCause), e.g. "run
// cancelled: worker shutting down".
func cancelReason(ctx context.Context) string {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return "run cancelled: " + cause.Error()
	}
	return "run cancelled"
}

// report settles the final status from the verdict and the persist error,
// builds the Outcome and its PATCH, traces it (stateReported) and returns
// the outcome with the run's error.
func (r *runner) report(ctx context.Context, ex execution, v verdict, st stored, persistErr error) (*Outcome, error) {
	p, wd := r.p, r.wd
	out := outcome(p, ex, v, st, persistErr)
	if wd.streamLoss != nil {
		// The terminal report follows the whole output, or says what of it
		// is missing: SUCCEEDED never hides a loss.
		out.Status, out.Reason = model.StatusFailed, joinReasons(out.Reason, wd.streamLoss.Error())
	}
	req := patch(out, wd.started, container(p, ex))
	req.Changes = out.Changes
	if len(st.artifacts) > 0 {
		// The first stored artifact in path order; every one is stored.
		a := st.artifacts[0]
		req.Artifact = &workerclient.Artifact{Key: a.Key, Size: a.Size, SHA256: a.SHA256, ContentType: a.ContentType}
	}
	var err error
	switch out.Status {
	case model.StatusSucceeded:
	case model.StatusPaused:
		err = fmt.Errorf("run %s: %w", p.ref.RunID, ErrPaused)
	default:
		err = &RunError{Status: out.Status, Reason: out.Reason, Err: errors.Join(v.err, persistErr, wd.streamLoss)}
	}
	if perr := r.tr.trace(ctx, transition{state: stateReported, ex: &ex, v: &v, out: out, req: req, st: &st}); perr != nil {
		err = errors.Join(err, reportError{perr})
	}
	return out, err
}

// outcome is the one place an Outcome is built. A failed persist fails the
// run, with the reason naming the kept copy.
func outcome(p *plan, ex execution, v verdict, st stored, persistErr error) *Outcome {
	out := &Outcome{
		Status:             v.status,
		Reason:             v.reason,
		Exit:               ex.Exit,
		ContainerID:        ex.ContainerID,
		Image:              p.spec.Image,
		ImageDigest:        ex.ImageDigest,
		Artifacts:          st.artifacts,
		DroppedOutputBytes: ex.DroppedOutputBytes,
		Stored:             st.objects,
		Changes:            patchChanges(st.changes),
		Skipped:            st.skipped,
		DroppedSkips:       st.droppedSkips,
		DroppedRecordBytes: ex.DroppedRecordBytes,
		Usage:              ex.Usage,
		Checkpoint:         ex.Checkpoint,
		Result: RunResult{
			EndTime:          v.ended.UnixMilli(),
			Output:           st.output,
			OutputStr:        string(st.output),
			RunArtifactsDir:  st.artifactsDir,
			PromptTokens:     ex.PromptTokens,
			CompletionTokens: ex.CompletionTokens,
			TracePath:        st.tracePath,
		},
	}
	if persistErr != nil {
		out.Status, out.Reason = model.StatusFailed, joinReasons(out.Reason,
			fmt.Sprintf("%v (the run directory %s is kept; `taskrun persist` retries)", persistErr, p.dirs.Dir))
	}
	return out
}

// failEarly reports a run refused before it touched disk or Docker: FAILED,
// or CANCELLED when the caller cancelled meanwhile. The PATCH is sent only
// when the run ID itself is valid, since it names the URL, and on a context
// of its own so that a cancellation cannot swallow it.
func failEarly(ctx context.Context, in runInput, cause error) (*Outcome, error) {
	status := model.StatusFailed
	if ctx.Err() != nil {
		status = model.StatusCancelled
	}
	out := &Outcome{Status: status, Reason: cause.Error(), Result: RunResult{EndTime: time.Now().UnixMilli()}}
	if in.Updater != nil && in.Run != nil && model.ValidateID("run", in.Run.ID) == nil && !refusedForReuse(cause) {
		reportCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := in.Updater.UpdateRunStatus(reportCtx, in.Run.ID, patch(out, time.Time{}, nil)); err != nil {
			cause = errors.Join(cause, fmt.Errorf("report %s: %w", status, err))
		}
	}
	return out, &RunError{Status: status, Reason: out.Reason, Err: cause}
}

// patch builds the PATCH body for an outcome; started is zero and c nil
// for a run that never started.
func patch(out *Outcome, started time.Time, c *workerclient.ContainerInfo) *workerclient.PatchTaskRunRequest {
	res := out.Result
	req := &workerclient.PatchTaskRunRequest{
		Status:           out.Status,
		EndedAt:          ptr(res.EndTime),
		PromptTokens:     res.PromptTokens,
		CompletionTokens: res.CompletionTokens,
	}
	if !started.IsZero() {
		req.StartedAt = ptr(started.UnixMilli())
	}
	if res.Output != nil {
		text, cut := capOutput(res.Output, MaxPatchOutputBytes)
		req.Output = ptr(string(text))
		req.OutputTruncated = cut
	}
	if out.Reason != "" {
		req.Error = ptr(out.Reason)
	}
	if out.ContainerID != "" && c != nil {
		req.ExitCode = ptr(out.Exit.ExitCode)
		req.Container = c
	}
	if res.TracePath != "" {
		req.TracePath = ptr(res.TracePath)
	}
	return req
}

// container describes the run's container for the control plane; nil when
// none ran.
func container(p *plan, ex execution) *workerclient.ContainerInfo {
	if ex.ContainerID == "" {
		return nil
	}
	runtime := ex.Runtime
	if runtime == "" {
		runtime = p.policy.Runtime
	}
	return &workerclient.ContainerInfo{ID: ex.ContainerID, Runtime: runtime, ImageDigest: ex.ImageDigest}
}

// joinReasons joins the non-empty reasons with "; ".
func joinReasons(reasons ...string) string {
	var out string
	for _, r := range reasons {
		switch {
		case r == "":
		case out == "":
			out = r
		default:
			out += "; " + r
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }
