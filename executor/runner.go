package executor

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/records"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// runner walks one admitted, journaled run through its lifecycle: it is the
// only code that calls the run's hooks (hooks.go), and it owns the
// concurrency between them: the container created while the hooks below
// the create point prepare, and removed while the run is collected.
type runner struct {
	p     *plan
	wd    *workdir
	tr    *tracer
	hooks []hook
	// createAt is the create point: the index of the first hook the engine
	// need not wait for (-1: none, the container is created at start).
	createAt int
	// stdout and stderr are where the container's output goes (Prestart);
	// selfCheck says stderr is filtered for the self-check's report.
	stdout, stderr io.Writer
	selfCheck      bool
	// exitedDone is set once the Exited hooks ran; resp is what they said.
	exitedDone bool
	resp       exitedResponse
	// pausing is the run's pause (Host.Pause), if any.
	pausing pausing
	// judgedErr is the judged journal write's failure: the record then
	// lacks the run's verdict and execution until a later write succeeds.
	judgedErr error
}

// newRunner builds the runner of p, whose journal record is j (nil
// without a journal) and whose start time is started.
func newRunner(p *plan, j *journal.Entry, started time.Time) *runner {
	wd := &workdir{started: started, records: records.NewBudget(p.limits.records), journal: j, owner: policyOwner(p.policy.User)}
	wd.isolationRoom = wd.records.Take(maxIsolationRecordBytes)
	r := &runner{p: p, wd: wd, tr: &tracer{p: p, wd: wd}}
	r.pausing.ended = make(chan struct{})
	r.hooks, r.createAt = runHooks(p, wd)
	return r
}

// run runs the container and finishes the run: whatever fails, the later
// events still happen, so a failed run persists what exists and reports a
// final status.
func (r *runner) run(ctx context.Context) (*Outcome, error) {
	p, wd := r.p, r.wd
	// Once ctx is cancelled, everything left has ShutdownGrace at most.
	hard, cancelHard := shutdownContext(ctx, p.in.ShutdownGrace)
	defer cancelHard()

	l, runErr := r.prestart(ctx)
	var ex execution
	var removed <-chan struct{}
	if runErr == nil {
		var h sandbox.Handle
		h, ex, runErr = r.supervise(ctx, hard, l)
		// The container is removed in the background once it exited,
		// while the run's outputs are collected.
		removed = r.removeContainer(ctx, h)
	}
	if !r.exitedDone { // the container never ran
		resp, err := r.exited(ctx, sandbox.Result{})
		ex.apply(resp)
		runErr = errors.Join(runErr, err)
	}
	if ex.DroppedRecordBytes = wd.records.Refused(); ex.DroppedRecordBytes > 0 {
		p.log.Warn("host records over the run's budget were dropped", "budget_bytes", p.limits.records, "dropped_bytes", ex.DroppedRecordBytes)
	}
	l.discardUnstarted(ctx, p)
	v := judge(ctx, p, ex, runErr)
	r.pauseVerdict(&v, &ex)
	r.judgedErr = r.tr.trace(ctx, transition{state: stateJudged, v: &v, ex: &ex})

	// Collecting and reporting happen even when ctx was cancelled, each with
	// a deadline of its own, so a slow store cannot starve the final report.
	collectCtx, cancelCollect := context.WithTimeout(hard, deadline(p.in.PersistTimeout, DefaultPersistTimeout))
	stopCollect := p.timings.Start(timings.Collect)
	st, persistErr := r.keepAndCollect(collectCtx, ex, v)
	stopCollect()
	cancelCollect()
	// The container was removed while the outputs were collected; the
	// journal stops tracking it, and the hooks release the run's uid and
	// directory, only once it is gone.
	if removed != nil {
		<-removed
		r.tr.step("removed")
	}
	persistErr = errors.Join(persistErr, r.tr.trace(ctx, transition{state: stateCollected, persistErr: persistErr}))
	finishStream(hard, p, wd, ex)
	p.timings.Time(timings.Release, func() error { r.stop(ctx, persistErr); return nil })

	reportCtx, cancelReport := context.WithTimeout(hard, deadline(p.in.ReportTimeout, DefaultReportTimeout))
	defer cancelReport()
	out, err := r.report(reportCtx, ex, v, st, persistErr)
	r.tr.trace(ctx, transition{state: stateEnded, keep: persistErr != nil || reportFailed(err)})
	out.Timings = p.timings.Spans()
	r.pausing.out = out
	close(r.pausing.ended)
	return out, err
}

// prestart runs the Prestart hooks in order, starting the container's
// create at the create point when the backend can create ahead and hooks
// remain to run meanwhile; then it plans the container (Configure) if the
// create did not. It stops at the first failure.
func (r *runner) prestart(ctx context.Context) (*launch, error) {
	defer r.p.timings.Start(timings.Prepare)()
	var l *launch
	var filter func(io.Writer) io.Writer
	for i, h := range r.hooks {
		if i == r.createAt {
			l = r.createAhead(ctx)
		}
		if ph, ok := h.(prestartHook); ok {
			r.tr.step("prestart:" + h.name())
			var resp prestartResponse
			err := ph.prestart(ctx, &prestartRequest{Owner: r.wd.owner, Records: r.wd.records}, &resp)
			if resp.DiskCapMounted {
				r.tr.trace(ctx, transition{state: statePrepared})
			}
			if resp.Stdout != nil {
				r.stdout, r.stderr = resp.Stdout, resp.Stderr
			}
			if resp.StderrFilter != nil {
				filter = resp.StderrFilter
			}
			if err != nil {
				return l, err
			}
		}
	}
	if filter != nil {
		r.stderr, r.selfCheck = filter(r.stderr), true
	}
	if l == nil {
		l = newLaunch(r.p, r.wd, r.hooks)
	}
	return l, nil
}

// poststart runs the Poststart hooks, in order, once the container started.
func (r *runner) poststart(ctx context.Context, req *poststartRequest) {
	for _, h := range r.hooks {
		if ph, ok := h.(poststartHook); ok {
			r.tr.step("poststart:" + h.name())
			ph.poststart(ctx, req)
		}
	}
}

// exited runs the Exited hooks, once, in order: what served the container
// stops with it. res is the container's result, zero when none ran.
func (r *runner) exited(ctx context.Context, res sandbox.Result) (*exitedResponse, error) {
	if r.exitedDone {
		return &r.resp, nil
	}
	r.exitedDone = true
	var errs []error
	for _, h := range r.hooks {
		if eh, ok := h.(exitedHook); ok {
			r.tr.step("exited:" + h.name())
			errs = append(errs, eh.exited(ctx, &exitedRequest{Result: res}, &r.resp))
		}
	}
	return &r.resp, errors.Join(errs...)
}

// stop runs every Stop hook, in reverse order, once the container is gone.
func (r *runner) stop(ctx context.Context, persistErr error) {
	req := &stopRequest{PersistErr: persistErr}
	for i := len(r.hooks) - 1; i >= 0; i-- {
		if sh, ok := r.hooks[i].(stopHook); ok {
			r.tr.step("stop:" + r.hooks[i].name())
			sh.stop(ctx, req)
		}
	}
}

// configureAll has every Configure hook, in order, add to the container
// plan spec.
func configureAll(hooks []hook, spec *sandbox.Spec) {
	req := &configureRequest{Spec: spec}
	for _, h := range hooks {
		if c, ok := h.(configureHook); ok {
			c.configure(req)
		}
	}
}

// collectEvents runs the Collect hooks (the executor's records) beside
// the beside-Collect hooks (the agent's files), then, once both are done,
// the Seal hooks; each step's error goes to its sequence's steps.
func (r *runner) collectEvents(ctx context.Context, req *collectRequest, seal *sealRequest, records, files *persistSteps) (recResp, filesResp collectResponse) {
	hooks, tr := r.hooks, r.tr
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, h := range hooks {
			if ch, ok := h.(collectHook); ok {
				records.do(ch.collect(ctx, req, &recResp), h.name()+" record")
			}
		}
	})
	for _, h := range hooks {
		if bh, ok := h.(besideCollectHook); ok {
			tr.step("collect:" + h.name())
			bh.collectBeside(ctx, req, &filesResp, files.do)
		}
	}
	wg.Wait()
	for _, h := range hooks {
		if sh, ok := h.(sealHook); ok {
			tr.step("seal:" + h.name())
			sh.seal(ctx, seal, &filesResp, files.do)
		}
	}
	return recResp, filesResp
}
