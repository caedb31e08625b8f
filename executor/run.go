package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskrun/taskrun/timings"
)

// ErrRunFailed matches (errors.Is) the *RunError that Execute returns for a
// run that ended in FAILED or CANCELLED.
var ErrRunFailed = errors.New("run failed")

// ErrInvalidInput is wrapped by errors about a run's input (a Spec, or the seed's RunTaskInput).
var ErrInvalidInput = errors.New("invalid run input")

// cleanupTimeout bounds removing the container and an early report, on a
// context detached from the caller's cancellation.
const cleanupTimeout = 2 * time.Minute

// execute executes one run end to end and reports it through
// input.Updater. The error is nil only when the run SUCCEEDED; the Outcome
// is for callers that present the result (the CLI) or need the container's
// exit code. Host.Run composes input from a host and a spec.
//
// execute plans the run (plan.go), claims a warm container when the
// input's pool has one ready (warm.go), admits and journals it
// (crashsafe.go), and hands it to the runner (runner.go), which sequences
// the rest over the run's hooks (hooks.go, *_hook.go). Whatever fails
// after admission, the later events still happen: a failed run persists
// what exists and reports a final status.
func execute(ctx context.Context, input runInput) (*Outcome, error) {
	rec := input.Timings
	if rec == nil {
		rec = timings.New(nil)
	}
	fail := func(err error) (*Outcome, error) {
		out, err := failEarly(ctx, input, err)
		out.Timings = rec.Spans()
		return out, err
	}
	stopPlan := rec.Start(timings.Plan)
	p, err := newPlan(input)
	if err == nil && input.Sandbox == nil {
		err = fmt.Errorf("%w: Sandbox is required", ErrInvalidInput)
	}
	stopPlan()
	if err == nil {
		p.timings = rec
		err = rec.Time(timings.Preflight, func() error { return p.preflight(ctx) })
	}
	if err == nil && input.WarmPool != nil && input.restore == nil {
		// After preflight: the warm container must run the image the run
		// resolved (a moved tag is another key).
		rec.Since(timings.WarmClaim, claimWarm(ctx, p))
	}
	if err != nil {
		return fail(err)
	}

	// The run is journaled before anything of it exists on the host, and
	// refused when the host has no room for it.
	if err := rec.Time(timings.Admit, func() error { return admit(p) }); err != nil {
		discardWarm(ctx, p)
		return fail(err)
	}
	// One start time names the run everywhere: its journal record, its
	// run index key (RUNNING, then final, or recovered) and its reports.
	started := time.Now().UTC()
	stopJournal := rec.Start(timings.Journal)
	j, err := beginJournal(p, started)
	stopJournal()
	if err != nil {
		discardWarm(ctx, p)
		return fail(err)
	}
	return newRunner(p, j, started).run(ctx)
}
