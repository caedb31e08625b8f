package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/fencedstore"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
)

// liveRun is one run the worker holds.
type liveRun struct {
	a      *workerclient.Assignment
	cancel context.CancelCauseFunc
	mem    int64
	disk   int64
}

// start takes a leased run: it reserves its slot, memory and disk and
// executes it in the background.
func (w *Worker) start(runsCtx context.Context, a *workerclient.Assignment, granted time.Time) {
	ctx, cancel := context.WithCancelCause(runsCtx)
	r := &liveRun{a: a, cancel: cancel, mem: w.runMemory(a.Limits.MemoryBytes),
		disk: w.runDisk(a.Limits.DiskBytes, a.Limits.MaxOutputBytes)}
	w.mu.Lock()
	var misfit error
	if free := w.cfg.MemoryBytes - w.memUsed; r.mem > free {
		misfit = fmt.Errorf("it needs %d bytes of memory, this worker has %d left", r.mem, free)
	}
	w.live[a.Lease.RunID] = r
	w.memUsed += r.mem
	w.diskUsed += r.disk
	w.metrics.busy.Set(float64(len(w.live)))
	w.mu.Unlock()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer w.finish(r)
		w.execute(ctx, cancel, a, granted, misfit)
	}()
}

// finish releases a run's reservation and wakes the lease loop.
func (w *Worker) finish(r *liveRun) {
	r.cancel(context.Canceled)
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.live, r.a.Lease.RunID)
	w.memUsed -= r.mem
	w.diskUsed -= r.disk
	w.metrics.busy.Set(float64(len(w.live)))
	close(w.freed)
	w.freed = make(chan struct{})
}

// execute runs one leased run to its end, renewing its lease meanwhile.
func (w *Worker) execute(ctx context.Context, cancel context.CancelCauseFunc, a *workerclient.Assignment, granted time.Time, misfit error) {
	log := w.log.With("run", a.Lease.RunID, "epoch", a.Lease.Epoch)
	fenced := w.cfg.Client.Fenced(a.Lease)
	g := &gate{updater: fenced, stream: fenced.Stream(), lease: a.Lease, lost: func(err error) { w.lose(log, cancel, err) }}
	g.onRunning = func() { w.metrics.coldStart.Observe(time.Since(granted).Seconds()) }
	g.onSent = func(n int) { w.metrics.streamBytes.Add(float64(n)) }

	renewDone := make(chan struct{})
	var renewers sync.WaitGroup
	renewers.Add(1)
	go func() {
		defer renewers.Done()
		w.renew(ctx, log, a.Lease, granted, g, cancel, renewDone)
	}()
	defer func() {
		close(renewDone)
		renewers.Wait()
	}()

	log.Info("run leased", "task", a.Task.ID, "image", a.Image)
	spec, cleanup, err := w.spec(ctx, a, g)
	defer cleanup()
	if err == nil {
		err = misfit
	}
	if err != nil {
		// Nothing was started: say why, as a failed run.
		log.Warn("cannot place the leased run", "err", err)
		w.refuse(ctx, g, a, err)
		return
	}
	spec.OnUsage = func(u sandbox.Usage) { w.metrics.sampleRun(a.Lease.RunID, u) }
	defer w.metrics.forgetRun(a.Lease.RunID)
	if a.KeepAlive {
		live, err := w.attach(ctx, cancel, a, log)
		if err != nil {
			log.Warn("cannot serve the live run", "err", err)
			w.refuse(ctx, g, a, err)
			return
		}
		defer live.Detach()
		live.Hook(&spec)
	}
	run := w.cfg.Host.Run
	if parent := a.Run.ParentRunID; parent != "" {
		from, err := w.forkFrom(ctx, a)
		if err != nil {
			log.Warn("cannot fork the run's parent", "parent", parent, "err", err)
			w.refuse(ctx, g, a, err)
			return
		}
		run = func(ctx context.Context, spec executor.Spec) (*executor.Outcome, error) {
			return w.cfg.Host.Fork(ctx, spec, from)
		}
		log.Info("forking the run's parent", "parent", parent, "from_checkpoint", from.Checkpoint != nil)
	} else if a.Resume {
		m, err := w.checkpointOf(ctx, a)
		if err != nil {
			log.Warn("cannot resume the paused run: it stays PAUSED", "err", err)
			w.stayPaused(ctx, g, a, err)
			return
		}
		run = func(ctx context.Context, spec executor.Spec) (*executor.Outcome, error) {
			out, err := w.cfg.Host.Resume(ctx, spec, m)
			if out == nil && err != nil {
				// Refused before it ran (a changed or foreign checkpoint, a
				// looser policy): nothing was reported, it stays PAUSED.
				w.stayPaused(ctx, g, a, err)
			}
			return out, err
		}
		log.Info("resuming the paused run from its checkpoint", "kind", m.Kind, "digest", m.Digest)
	}
	out, err := run(ctx, spec)
	status := model.StatusFailed
	if out != nil {
		status = out.Status
		if t := out.Result.PromptTokens; t != nil {
			w.metrics.tokens.WithLabelValues("prompt").Add(float64(*t))
		}
		if t := out.Result.CompletionTokens; t != nil {
			w.metrics.tokens.WithLabelValues("completion").Add(float64(*t))
		}
		w.metrics.observeUsage(out.Usage)
	}
	if g.isLost() {
		w.metrics.runs.WithLabelValues("LOST").Inc()
		log.Warn("run stopped: its lease was lost; nothing was reported after that", "cause", context.Cause(ctx))
		return
	}
	w.metrics.runs.WithLabelValues(string(status)).Inc()
	w.metrics.duration.Observe(time.Since(granted).Seconds())
	if err != nil && !errors.Is(err, executor.ErrRunFailed) {
		log.Warn("run ended with an error", "status", status, "err", err)
	}
}

// lose stops a run whose lease is lost: the gate already drops its calls.
// The container is killed at once (sandbox.KillNow), with no stop grace:
// the control plane may already have given the run to another worker.
func (w *Worker) lose(log *slog.Logger, cancel context.CancelCauseFunc, err error) {
	w.metrics.leasesLost.Inc()
	log.Warn("lease lost: killing the run's container", "err", err)
	cancel(sandbox.KillNow(err))
}

// refuse reports a leased run the worker cannot place FAILED, started never.
func (w *Worker) refuse(ctx context.Context, g *gate, a *workerclient.Assignment, cause error) {
	msg := "worker cannot place the run: " + cause.Error()
	now := time.Now().UnixMilli()
	hard, stop := graceContext(ctx, w.cfg.Host.ShutdownGrace())
	defer stop()
	rctx, cancel := context.WithTimeout(hard, executor.DefaultReportTimeout)
	defer cancel()
	if err := g.UpdateRunStatus(rctx, a.Lease.RunID, &workerclient.PatchTaskRunRequest{
		Status: model.StatusFailed, EndedAt: &now, Error: &msg,
	}); err != nil {
		w.log.Warn("report a run the worker cannot place", "run", a.Lease.RunID, "err", err)
	}
	w.metrics.runs.WithLabelValues(string(model.StatusFailed)).Inc()
}

// checkpointOf finds the checkpoint of the paused run a: the one its
// latest record in its tenant's run index names.
func (w *Worker) checkpointOf(ctx context.Context, a *workerclient.Assignment) (checkpoint.Manifest, error) {
	records := w.records()
	if records == nil {
		return checkpoint.Manifest{}, errors.New("this worker has no run index to find the run's checkpoint in")
	}
	rec, err := runindex.Find(ctx, records, a.Lease.RunID, a.Task.UserID)
	switch {
	case err != nil:
		return checkpoint.Manifest{}, fmt.Errorf("find the paused run's record: %w", err)
	case rec.Status != model.StatusPaused || rec.Checkpoint == nil:
		return checkpoint.Manifest{}, fmt.Errorf("the run's latest record is %s with no checkpoint", rec.Status)
	}
	return *rec.Checkpoint, nil
}

// forkFrom is what the fork a starts from: its parent's checkpoint when
// the parent's latest record names one, else the parent's stored home
// (its session state), both checked by the fork against the digest the
// record keeps.
func (w *Worker) forkFrom(ctx context.Context, a *workerclient.Assignment) (executor.ForkFrom, error) {
	records := w.records()
	if records == nil {
		return executor.ForkFrom{}, errors.New("this worker has no run index to find the parent's checkpoint in")
	}
	rec, err := runindex.Find(ctx, records, a.Run.ParentRunID, a.Task.UserID)
	if err != nil {
		return executor.ForkFrom{}, fmt.Errorf("find the parent's record: %w", err)
	}
	if rec.Checkpoint != nil {
		m := *rec.Checkpoint
		return executor.ForkFrom{Checkpoint: &m}, nil
	}
	for _, o := range rec.Stored {
		if o.Key != "" && o.Key == rec.Keys.State {
			return executor.ForkFrom{State: &executor.ForkState{Object: executor.SessionStateName, SHA256: o.SHA256}}, nil
		}
	}
	return executor.ForkFrom{}, fmt.Errorf("run %s (%s) stored neither a checkpoint nor its home", rec.RunID, rec.Status)
}

// records is the run index: Config.Records, else the host's store.
func (w *Worker) records() *persist.Store {
	if w.cfg.Records != nil {
		return w.cfg.Records
	}
	st, _ := w.cfg.Host.Store().(*persist.Store)
	return st
}

// stayPaused reports a run leased to be resumed that could not be PAUSED
// again, with why: its lease ends and its owner may resume it again.
func (w *Worker) stayPaused(ctx context.Context, g *gate, a *workerclient.Assignment, cause error) {
	msg := "resume refused: " + cause.Error()
	hard, stop := graceContext(ctx, w.cfg.Host.ShutdownGrace())
	defer stop()
	rctx, cancel := context.WithTimeout(hard, executor.DefaultReportTimeout)
	defer cancel()
	if err := g.UpdateRunStatus(rctx, a.Lease.RunID, &workerclient.PatchTaskRunRequest{Status: model.StatusPaused, Error: &msg}); err != nil {
		w.log.Warn("report a run that stays paused", "run", a.Lease.RunID, "err", err)
	}
}

// graceContext is ctx without its cancellation, ended grace after ctx is
// cancelled (a drain past its grace, a lost lease): a report the worker
// makes itself outlives the run's cancellation, but not the shutdown
// bound. A grace of zero never ends it.
func graceContext(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	hard, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if grace <= 0 {
		return hard, cancel
	}
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-hard.Done():
		}
	})
	return hard, func() {
		stop()
		cancel()
	}
}

// renew keeps the lease until done closes. It stops the run (through the
// gate) when the lease is refused or not renewed for a whole TTL.
func (w *Worker) renew(ctx context.Context, log *slog.Logger, l workerclient.Lease, granted time.Time, g *gate, cancel context.CancelCauseFunc, done <-chan struct{}) {
	ttl := time.Duration(l.TTLMillis) * time.Millisecond
	every := time.Duration(l.RenewMillis) * time.Millisecond
	if every <= 0 || every > ttl/2 {
		every = ttl / 3
	}
	// lastOK is on the monotonic clock, counted from when the lease was
	// handed out (see handedOut): the worker's idea of the expiry is never
	// later than the control plane's.
	lastOK := granted
	cancelled := false
	for {
		t := time.NewTimer(every)
		select {
		case <-done:
			t.Stop()
			return
		case <-t.C:
		}
		deadline := lastOK.Add(ttl)
		rctx, stop := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		asked := time.Now()
		resp, err := w.cfg.Client.RenewLease(rctx, l)
		stop()
		if g.reported.Load() {
			return // the terminal PATCH ended the lease: nothing to renew
		}
		switch {
		case err == nil:
			lastOK = asked
			w.metrics.renewals.Inc()
			if resp.Cancel && !cancelled {
				cancelled = true
				log.Info("the run was cancelled by its owner")
				cancel(ErrCancelledByOwner)
			}
		case fencedstore.Lost(err):
			w.metrics.renewFailures.Inc()
			g.lose(err)
			return
		case !time.Now().Before(deadline):
			w.metrics.renewFailures.Inc()
			g.lose(fmt.Errorf("%w: %w", ErrLeaseExpired, err))
			return
		default:
			w.metrics.renewFailures.Inc()
			log.Warn("renew the lease", "err", err)
		}
	}
}

// spec is the run's executor.Spec: the assignment's task and requests on
// top of the host's defaults, fenced with the lease. cleanup removes what
// it created (the downloaded workspace).
func (w *Worker) spec(ctx context.Context, a *workerclient.Assignment, g *gate) (executor.Spec, func(), error) {
	task, run := a.Task, a.Run
	run.Status = model.StatusRunning
	spec := executor.Spec{
		Task: &task, Run: &run, SessionID: a.SessionID,
		Updater: g, StreamSender: g,
		// Every write of the run's objects confirms its lease first; once
		// the lease is lost, nothing more is stored.
		Lease:   &executor.Lease{Epoch: a.Lease.Epoch, Token: a.Lease.Token, Confirm: g.confirm},
		Image:   a.Image,
		Command: a.Command,
	}
	dir := w.workspaceDir(a.Lease.RunID, a.Lease.Epoch)
	cleanup := func() { w.removeAll(dir) }
	policy := w.cfg.Host.Defaults().Policy
	if a.Runtime != "" {
		if len(w.cfg.Labels.Runtimes) > 0 && !slices.Contains(w.cfg.Labels.Runtimes, a.Runtime) {
			return spec, cleanup, fmt.Errorf("runtime %q is not one of this worker's (%v)", a.Runtime, w.cfg.Labels.Runtimes)
		}
		policy.Runtime = a.Runtime
	}
	if len(a.Env) > 0 {
		if err := config.CheckEnv(a.Env); err != nil {
			return spec, cleanup, err
		}
		spec.Env = slices.Clone(a.Env)
	}
	// The assignment is a tenant's request: its limits within the
	// operator's maxima, its egress granted by the operator's policy.
	lim := a.Limits
	if err := w.cfg.RunMaxima.Check(lim); err != nil {
		return spec, cleanup, err
	}
	if lim.TimeoutMillis > 0 {
		spec.Timeout = time.Duration(lim.TimeoutMillis) * time.Millisecond
	}
	if lim.MemoryBytes > 0 {
		policy.MemoryBytes = lim.MemoryBytes
	}
	if lim.CPUs > 0 {
		policy.NanoCPUs = int64(lim.CPUs * 1e9)
	}
	if lim.PIDs > 0 {
		policy.PidsLimit = lim.PIDs
	}
	spec.Policy = &policy
	spec.DiskLimitBytes, spec.MaxOutputBytes = lim.DiskBytes, lim.MaxOutputBytes
	if a.Model != "" {
		if w.cfg.Models == nil {
			return spec, cleanup, fmt.Errorf("model %q: this worker has no models configured", a.Model)
		}
		m, err := w.cfg.Models(a.Model)
		if err != nil {
			return spec, cleanup, fmt.Errorf("model %q: %w", a.Model, err)
		}
		spec.Model = m
	}
	if lim.MaxTokens > 0 {
		spec.Model.MaxTokens = int(lim.MaxTokens)
	}
	req, err := egress.ParseTenantRequest(a.Egress)
	if err != nil {
		return spec, cleanup, err
	}
	if spec.Egress, err = w.cfg.Egress.Grant(a.Task.UserID, req); err != nil {
		return spec, cleanup, err
	}
	if a.KeepAlive && len(spec.Command) == 0 {
		spec.Entrypoint, spec.Command = daemon.IdleCommand[:1], daemon.IdleCommand[1:]
	}
	task.WorkspaceDir = ""
	if a.Workspace != nil {
		home, err := w.fetchWorkspace(ctx, a.Workspace, dir)
		if err != nil {
			return spec, cleanup, fmt.Errorf("workspace %s: %w", a.Workspace.Key, err)
		}
		task.WorkspaceDir = home
	}
	return spec, cleanup, nil
}

// gate is a leased run's updater and stream sender: a client fenced with
// the lease's epoch that, once the lease is lost, drops every call (so
// nothing is reported after that) and treats a 412 as the loss of the lease.
type gate struct {
	updater   *workerclient.Client
	stream    workerclient.StreamSender
	lease     workerclient.Lease
	lost      func(error)
	onRunning func()
	onSent    func(n int)

	gone atomic.Bool
	// reported is set once the terminal PATCH was accepted: the lease ended.
	reported atomic.Bool
	once     sync.Once
	running  sync.Once
}

func (g *gate) isLost() bool { return g.gone.Load() }

// lose marks the lease lost, once.
func (g *gate) lose(err error) {
	g.once.Do(func() {
		g.gone.Store(true)
		g.lost(err)
	})
}

// confirm is the run's fencedstore.Confirm: before a store write it renews
// the lease. A refusal is the loss of the lease (the container is killed at
// once); after the terminal report the run has ended and nothing more is
// written.
func (g *gate) confirm(ctx context.Context) error {
	switch {
	case g.isLost():
		return fmt.Errorf("run %s: %w", g.lease.RunID, workerclient.ErrLeaseLost)
	case g.reported.Load():
		return fmt.Errorf("run %s ended: %w", g.lease.RunID, workerclient.ErrLeaseLost)
	}
	_, err := g.updater.RenewLease(ctx, g.lease)
	if fencedstore.Lost(err) {
		g.lose(err)
	}
	return err
}

// filter turns a refused fence into the loss of the lease. A dropped call
// returns nil: the run's outcome is no longer this worker's to report, and
// it must not be kept for a report retry either.
func (g *gate) filter(err error) error {
	if fencedstore.Lost(err) {
		g.lose(err)
		return nil
	}
	return err
}

// UpdateRunStatus implements executor.TaskRunUpdater.
func (g *gate) UpdateRunStatus(ctx context.Context, runID string, req *workerclient.PatchTaskRunRequest) error {
	if g.isLost() {
		return nil
	}
	err := g.filter(g.updater.UpdateRunStatus(ctx, runID, req))
	if err == nil && req.Status.Terminal() && !g.isLost() {
		g.reported.Store(true)
	}
	if err == nil && req.Status == model.StatusRunning && g.onRunning != nil {
		g.running.Do(g.onRunning)
	}
	return err
}

// Send implements workerclient.StreamSender.
func (g *gate) Send(ctx context.Context, runID string, d workerclient.Delta) error {
	if g.isLost() {
		return nil
	}
	err := g.filter(g.stream.Send(ctx, runID, d))
	if err == nil && g.onSent != nil {
		g.onSent(len(d.Data))
	}
	return err
}

// End implements workerclient.StreamSender.
func (g *gate) End(ctx context.Context, runID string, total int64) error {
	if g.isLost() {
		return nil
	}
	return g.filter(g.stream.End(ctx, runID, total))
}

// ErrIdle is the cause a live run is stopped with at its idle timeout.
var ErrIdle = errors.New("stopped: idle past its idle timeout")

// attach makes a keep-alive run reachable through the worker's live API,
// its idle timeout the assignment's within the operator's bound. An idle
// run is paused with Config.PauseOnIdle (stopped when the pause fails),
// else stopped.
func (w *Worker) attach(ctx context.Context, cancel context.CancelCauseFunc, a *workerclient.Assignment, log *slog.Logger) (*daemon.Attached, error) {
	if w.cfg.Live == nil {
		return nil, errors.New("this worker serves no live runs (keep_alive): start it with --live-listen")
	}
	runID := a.Lease.RunID
	onIdle := func() { cancel(ErrIdle) }
	if w.cfg.PauseOnIdle {
		onIdle = func() {
			go func() {
				if _, err := w.cfg.Host.Pause(context.WithoutCancel(ctx), runID); err != nil {
					log.Warn("pause an idle live run: stopping it", "err", err)
					cancel(ErrIdle)
				}
			}()
		}
	}
	return w.cfg.Live.Attach(ctx, daemon.AttachOptions{
		Ref:     persist.RunRef{UserID: a.Task.UserID, ConversationID: a.Task.ConversationID, TaskID: a.Task.ID, RunID: runID},
		Ports:   a.Ports,
		MaxIdle: time.Duration(a.IdleTimeoutMillis) * time.Millisecond,
		Cancel:  func() { cancel(context.Canceled) },
		OnIdle:  onIdle,
	})
}
