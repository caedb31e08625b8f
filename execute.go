package taskrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/spool"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workspace"
)

// In-container locations of the run contract (see DESIGN.md).
const (
	containerRunDir  = "/taskrun"
	containerHome    = containerRunDir + "/home"
	promptFileName   = "prompt.txt"
	stdoutSpoolName  = "stdout.log"
	stderrSpoolName  = "stderr.log"
	defaultStopGrace = 10 * time.Second
)

// Budgets of the steps that run after the container, on a context detached
// from the caller's cancellation.
const (
	// persistTimeout bounds all uploads of one run (logs up to
	// DefaultMaxOutputBytes each, artifacts, session state).
	persistTimeout = 30 * time.Minute
	// cleanupTimeout bounds removing the container and the final report.
	cleanupTimeout = 2 * time.Minute
)

// streamDrainTimeout bounds how long a finished run waits for its output
// consumers (a variable so tests can shorten it).
var streamDrainTimeout = 2 * time.Minute

// run drives the steps of a validated run. Whatever happens, it persists what
// exists and reports a final status.
func (r *runner) run(ctx context.Context) (*Outcome, error) {
	r.started = time.Now()
	runErr := r.prepare(ctx)
	if runErr == nil {
		runErr = r.execute(ctx)
	}
	r.out.Result.EndTime = time.Now().UnixMilli()
	r.out.Status, r.out.Reason = r.verdict(ctx, runErr)
	// Persisting and reporting happen even when ctx was cancelled, each with
	// a budget of its own, so a slow store cannot starve the final report.
	persistCtx, cancelPersist := context.WithTimeout(context.WithoutCancel(ctx), persistTimeout)
	persistErr := r.persist(persistCtx, runErr)
	cancelPersist()
	r.releaseLocal(persistErr)
	reportCtx, cancelReport := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancelReport()
	return r.report(reportCtx, runErr, persistErr)
}

// prepare materializes the run directory: dirs, the user's persistent files,
// the workspace or the resumed session, the prompt and AGENTS.md.
func (r *runner) prepare(ctx context.Context) error {
	if err := r.createRunDirs(ctx); err != nil {
		return err
	}
	if err := os.MkdirAll(r.hostDir, 0o700); err != nil {
		return fmt.Errorf("create executor directory: %w", err)
	}
	if prev := r.in.Run.PreviousRunID; prev != "" {
		// The previous run's home already holds the persistent files and the
		// workspace as that run left them.
		if err := r.restoreSession(ctx, prev); err != nil {
			return err
		}
	} else if err := r.materializeHome(ctx); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.dirs.Dir, promptFileName), []byte(r.in.Task.Prompt), 0o644); err != nil {
		return fmt.Errorf("write prompt: %w", err)
	}
	if err := WriteRunAgentsMd(r.dirs.Dir, r.dirs.Home); err != nil {
		return fmt.Errorf("write AGENTS.md: %w", err)
	}
	return nil
}

// materializeHome copies the user's persistent files, then the task's
// workspace, into home.
func (r *runner) materializeHome(ctx context.Context) error {
	opts := workspace.CopyOptions{Owner: &workspace.SandboxOwner}
	if dir := r.in.Paths.PersistentUserDir(r.ref.UserID); dirExists(dir) {
		if _, err := workspace.CopyTree(ctx, dir, r.dirs.Home, opts); err != nil {
			return fmt.Errorf("copy persistent user files: %w", err)
		}
	}
	if dir := r.in.Task.WorkspaceDir; dir != "" {
		if _, err := workspace.CopyTree(ctx, dir, r.dirs.Home, opts); err != nil {
			return fmt.Errorf("copy workspace %s: %w", dir, err)
		}
	}
	return nil
}

// restoreSession unpacks the previous run's session state into home. A
// rejected archive entry fails the run: a partial restore is never used.
func (r *runner) restoreSession(ctx context.Context, prevRunID string) error {
	prev := r.ref
	prev.RunID = prevRunID
	rc, err := r.in.Persist.OpenRunFile(ctx, prev, SessionStateName)
	if err != nil {
		return fmt.Errorf("fetch session state of run %s: %w", prevRunID, err)
	}
	defer rc.Close()
	opts := workspace.UnpackOptions{Owner: &workspace.SandboxOwner}
	if _, err := workspace.UnpackHome(ctx, rc, r.dirs.Home, opts); err != nil {
		return fmt.Errorf("restore session state of run %s: %w", prevRunID, err)
	}
	return nil
}

// execute runs the container, streaming its output through spools. The
// model gateway, when configured, lives exactly as long as the container.
func (r *runner) execute(ctx context.Context) (err error) {
	llm, err := r.startModel(ctx)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, llm.finish(&r.out.Result)) }()

	limit := spool.WithLimit(r.maxOutput())
	stdout, err := spool.New(filepath.Join(r.hostDir, stdoutSpoolName), limit)
	if err != nil {
		return fmt.Errorf("stdout spool: %w", err)
	}
	defer stdout.Close()
	stderr, err := spool.New(filepath.Join(r.hostDir, stderrSpoolName), limit)
	if err != nil {
		return fmt.Errorf("stderr spool: %w", err)
	}
	defer stderr.Close()

	spec := r.spec()
	spec.Env = append(spec.Env, llm.env()...)
	r.iso = r.newIsolation()
	var stderrSink io.Writer = stderr
	probe, err := r.probePath()
	if err != nil {
		return err
	}
	if probe != "" {
		if stderrSink, err = r.iso.apply(&spec, filepath.Dir(probe), stderr); err != nil {
			return fmt.Errorf("self-check: %w", err)
		}
	}
	h, err := r.in.Sandbox.Start(ctx, spec, r.policy, sandbox.Streams{Stdout: stdout, Stderr: stderrSink})
	if err != nil {
		return fmt.Errorf("start sandbox: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := h.Close(closeCtx); err != nil {
			r.log.Warn("remove container", "container", h.ID(), "err", err)
		}
	}()
	r.out.ContainerID = h.ID()
	r.log.Info("container started", "container", h.ID(), "image", spec.Image, "runtime", r.policy.Runtime)

	// A container that is not confined as asked is stopped at once.
	waitCtx, stop := context.WithCancel(ctx)
	defer stop()
	auditErr := r.auditLive(ctx, r.iso, h)
	if auditErr != nil {
		stop()
	}
	endDiskWatch := r.watchDisk(ctx, stop)

	followers := r.follow(ctx, stdout, stderr)
	if auditErr == nil {
		r.reportRunning(ctx)
	}

	res := h.Wait(waitCtx)
	diskErr := endDiskWatch()
	r.out.Exit = res
	var probeErr error
	r.probeReport, r.probeContradictions, probeErr = r.iso.probeVerdict(res)
	// Wait drained the container's streams; closing the spools lets the
	// consumers deliver the tail and finish.
	stdout.Close()
	stderr.Close()
	if err := followers.wait(); err != nil {
		r.log.Warn("stream output", "err", err)
	}
	if r.out.DroppedOutputBytes = stdout.Dropped() + stderr.Dropped(); r.out.DroppedOutputBytes > 0 {
		r.log.Warn("output over the cap was dropped", "cap_bytes", r.maxOutput(), "dropped_bytes", r.out.DroppedOutputBytes)
	}
	return errors.Join(auditErr, diskErr, probeErr, res.Err)
}

// labels are the caller's labels plus the run dir's host path, which lets
// `taskrun audit` check the bind mount's source exactly.
func (r *runner) labels() map[string]string {
	labels := maps.Clone(r.in.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[audit.LabelRunDir] = r.dirs.Dir
	return labels
}

// maxOutput is the cap on each output stream kept; 0 means none.
func (r *runner) maxOutput() int64 {
	switch {
	case r.in.MaxOutputBytes < 0:
		return 0
	case r.in.MaxOutputBytes == 0:
		return DefaultMaxOutputBytes
	}
	return r.in.MaxOutputBytes
}

// reportRunning sends the RUNNING PATCH in the background, so a slow
// control plane never delays supervising the container; report waits for it
// before the final PATCH, which keeps the two in order.
func (r *runner) reportRunning(ctx context.Context) {
	done := make(chan struct{})
	r.runningReported = done
	req := &workerclient.PatchTaskRunRequest{
		Status:    model.StatusRunning,
		StartedAt: ptr(r.started.UnixMilli()),
		Container: r.containerInfo(),
	}
	go func() {
		defer close(done)
		if err := r.in.Updater.UpdateRunStatus(ctx, r.in.Run.ID, req); err != nil {
			r.log.Warn("report RUNNING", "err", err)
		}
	}()
}

// spec is the container to run for this run.
func (r *runner) spec() sandbox.Spec {
	image := r.in.Image
	if image == "" {
		image = DefaultImage
	}
	timeout := r.in.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	return sandbox.Spec{
		Image:      image,
		Cmd:        r.in.Command,
		WorkingDir: containerHome,
		Env: []string{
			"HOME=" + containerHome,
			"TASKRUN_RUN_ID=" + r.ref.RunID,
			"TASKRUN_TASK_ID=" + r.ref.TaskID,
			"TASKRUN_SESSION_ID=" + r.in.SessionID,
			"TASKRUN_PROMPT_FILE=" + containerRunDir + "/" + promptFileName,
		},
		Mounts:    []sandbox.Mount{{Source: r.dirs.Dir, Target: containerRunDir}},
		Labels:    r.labels(),
		TenantID:  r.ref.UserID,
		TaskID:    r.ref.TaskID,
		RunID:     r.ref.RunID,
		Timeout:   timeout,
		StopGrace: defaultStopGrace,
	}
}

// followers deliver the spooled output to its consumers: the stream sender
// and the live stdout and stderr copies.
type followers struct {
	done   chan error
	n      int
	cancel context.CancelFunc
}

// follow starts one goroutine per consumer. Each reads the spool from disk on
// its own, so a slow or stalled consumer never blocks the container or the
// other consumers. They run on a context detached from the caller's: after a
// cancellation the container's last output (written during its stop grace)
// is still delivered, within streamDrainTimeout.
func (r *runner) follow(ctx context.Context, stdout, stderr *spool.Spool) *followers {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f := &followers{done: make(chan error, 3), cancel: cancel}
	start := func(s *spool.Spool, consume func(io.Reader) error) {
		f.n++
		go func() {
			rd := s.NewReaderContext(ctx, 0)
			defer rd.Close()
			f.done <- consume(rd)
		}()
	}
	if sender := r.in.StreamSender; sender != nil {
		start(stdout, func(rd io.Reader) error {
			_, err := workerclient.Pump(ctx, rd, r.in.Run.ID, sender, workerclient.PumpOptions{})
			return err
		})
	}
	for _, c := range []struct {
		w io.Writer
		s *spool.Spool
	}{{r.in.Stdout, stdout}, {r.in.Stderr, stderr}} {
		if c.w != nil {
			start(c.s, func(rd io.Reader) error {
				_, err := io.Copy(c.w, rd)
				return err
			})
		}
	}
	return f
}

// wait waits for the followers to deliver everything, bounded so a dead
// control plane or a blocked writer cannot hold the run: past
// streamDrainTimeout they are cancelled and left to finish on their own
// (undelivered bytes remain in the persisted output log; done is buffered,
// so no follower blocks on reporting).
func (f *followers) wait() error {
	timer := time.NewTimer(streamDrainTimeout)
	defer timer.Stop()
	var errs []error
	for range f.n {
		select {
		case err := <-f.done:
			errs = append(errs, err)
		case <-timer.C:
			f.cancel()
			return errors.Join(append(errs, errors.New("output consumers did not finish in time; the output log holds everything"))...)
		}
	}
	f.cancel()
	return errors.Join(errs...)
}

func dirExists(dir string) bool {
	info, err := os.Stat(dir)
	return err == nil && info.IsDir()
}
