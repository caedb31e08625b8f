package taskrun

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// report settles the final status from the run's verdict (r.out.Status and
// Reason, see verdict) and the persist step's error, sends the final PATCH
// and returns the outcome. runErr is the first error of preparing or running
// the container; persistErr is the persist step's.
func (r *runner) report(cleanupCtx context.Context, runErr, persistErr error) (*Outcome, error) {
	if r.out.Result.EndTime == 0 {
		r.out.Result.EndTime = time.Now().UnixMilli()
	}
	if persistErr != nil {
		r.out.Status, r.out.Reason = model.StatusFailed, joinReasons(r.out.Reason,
			fmt.Sprintf("%v (the run directory %s is kept; `taskrun persist` retries)", persistErr, r.dirs.Dir))
	}

	req := r.patch()
	if a := r.reportedArtifact(); a != nil {
		req.Artifact = a
	}
	if r.runningReported != nil {
		select {
		case <-r.runningReported:
		case <-cleanupCtx.Done():
		}
	}
	var err error
	if r.out.Status != model.StatusSucceeded {
		err = &RunError{Status: r.out.Status, Reason: r.out.Reason, Err: errors.Join(runErr, persistErr)}
	}
	if perr := r.in.Updater.UpdateRunStatus(cleanupCtx, r.in.Run.ID, req); perr != nil {
		err = errors.Join(err, fmt.Errorf("report %s: %w", r.out.Status, perr))
	}
	r.log.Info("run finished", "status", r.out.Status, "reason", r.out.Reason, "exit_code", r.out.Exit.ExitCode)
	return &r.out, err
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

// verdict maps what happened before persisting to a status and a reason.
func (r *runner) verdict(ctx context.Context, runErr error) (model.RunStatus, string) {
	exit := r.out.Exit
	switch {
	case ctx.Err() != nil:
		return model.StatusCancelled, "run cancelled"
	case runErr != nil:
		return model.StatusFailed, runErr.Error()
	case exit.TimedOut:
		return model.StatusFailed, fmt.Sprintf("timed out after %s", r.spec().Timeout)
	case exit.OOMKilled:
		return model.StatusFailed, fmt.Sprintf("out of memory: the container exceeded its %d MiB limit", r.policy.MemoryBytes>>20)
	case exit.Cancelled:
		return model.StatusCancelled, "run cancelled"
	case exit.ExitCode != 0:
		return model.StatusFailed, fmt.Sprintf("agent exited with code %d", exit.ExitCode)
	}
	return model.StatusSucceeded, ""
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

// reportedArtifact is the artifact named in the PATCH: the first stored
// artifact in path order. Every artifact is stored regardless.
func (r *runner) reportedArtifact() *workerclient.Artifact {
	if len(r.out.Artifacts) == 0 {
		return nil
	}
	a := r.out.Artifacts[0]
	return &workerclient.Artifact{Key: a.Key, Size: a.Size, SHA256: a.SHA256, ContentType: a.ContentType}
}
