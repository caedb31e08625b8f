package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/workerclient"
)

// daemonRunFlags are the flags of `taskrun run` a daemon takes as the
// run's (or that only this client reads). Any other flag names a machine
// of its own, so the run stays in this process.
var daemonRunFlags = map[string]bool{
	"user": true, "conversation": true, "task": true, "session": true, "run-id": true,
	"workspace": true, "prompt": true, "entrypoint": true, "resume-from": true, "change-exclude": true,
	"keep": true, "gc": true, "json": true, "raw": true, "max-tokens": true, "max-requests": true,
	"allow": true, "egress-policy": true, "env": true, "env-file": true, "local": true,
	"image": true, "timeout": true, "memory": true, "cpus": true, "pids": true, "max-output": true,
	"disk": true, "session-exclude": true, "model": true, "shutdown-grace": true,
	"quiet": true, "log-format": true, "detach": true, "port": true,
}

// machineFlag names a given flag that keeps the run in this process, or "".
func (o *runOptions) machineFlag() string {
	var name string
	o.flags.Visit(func(f *pflag.Flag) {
		if name == "" && !daemonRunFlags[f.Name] {
			name = "--" + f.Name
		}
	})
	if name == "" && len(o.egress.Credentials) > 0 {
		// A credential's value is read on this host, as this user.
		name = "--egress-policy (its credentials)"
	}
	return name
}

// daemonRequest is the run the flags ask the daemon for: the given limits,
// and nothing of this host's machine.
func (o *runOptions) daemonRequest() (daemon.RunRequest, error) {
	changed := o.flags.Changed
	req := daemon.RunRequest{
		RunID: o.runID, Conversation: o.conversation, Task: o.task, Session: o.session,
		Prompt: o.prompt, ResumeFrom: o.resumeFrom,
		Command: o.command, Entrypoint: entrypoint(o.entrypoint), Env: o.env,
		ChangeExcludes: changeExcludes(o.changeExcludes), KeepRunDir: o.keep,
		MaxRequests: o.model.MaxRequests, Ports: o.ports,
	}
	if changed("user") {
		req.User = o.user
	}
	if changed("image") {
		req.Image = o.image
	}
	if changed("session-exclude") {
		req.SessionExcludes = o.excludes
	}
	if changed("model") {
		req.Model = o.modelSpec
	}
	lim := workerclient.Limits{MaxTokens: int64(o.model.MaxTokens)}
	if changed("timeout") {
		lim.TimeoutMillis = max(o.timeout.Milliseconds(), 1)
	}
	if changed("memory") {
		lim.MemoryBytes = o.policy.MemoryBytes
	}
	if changed("cpus") {
		lim.CPUs = o.cpus
	}
	if changed("pids") {
		lim.PIDs = o.policy.PidsLimit
	}
	if changed("disk") {
		lim.DiskBytes = o.disk
	}
	if changed("max-output") {
		lim.MaxOutputBytes = o.maxOutput
	}
	req.Limits = lim
	if len(o.egress.Rules) > 0 {
		data, err := json.Marshal(egress.TenantRequest{Rules: o.egress.Rules, MaxBytes: o.egress.MaxBytes, MaxConnections: o.egress.MaxConnections})
		if err != nil {
			return req, err
		}
		req.Egress = data
	}
	return req, nil
}

// executeViaDaemon runs the task on the daemon at the socket; an error
// wrapping daemon.ErrNoDaemon says none answers there.
func executeViaDaemon(ctx context.Context, a *app, o *runOptions) (*executor.Outcome, error) {
	c, err := daemon.DialFirst(ctx, daemon.ClientSocketPaths())
	if errors.Is(err, daemon.ErrNoDaemon) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w; pass --local to run in this process", errCannotRun, err)
	}
	defer c.Close()
	path := c.Path()
	req, err := o.daemonRequest()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	a.log.Debug("running through the taskrun daemon", "socket", path, "run", o.runID)
	runStdout := a.stdout
	if o.jsonOut {
		runStdout = a.stderr
	}
	liveOut, flushOut := a.live(runStdout, o.raw)
	liveErr, flushErr := a.live(a.stderr, o.raw)
	defer flushErr()
	defer flushOut()
	// A second Ctrl-C leaves the cancelled run's wind-down to the daemon.
	secondSignalNote.Store(fmt.Sprintf("the daemon finishes run %s (taskrun logs %s)", o.runID, o.runID))
	start := time.Now()
	res, err := c.Run(ctx, req, o.workspace, liveOut, liveErr)
	if err != nil {
		if errors.Is(err, daemon.ErrRefused) {
			return nil, fmt.Errorf("%w: the taskrun daemon at %s refused run %s: %w", errCannotRun, path, o.runID, err)
		}
		return nil, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	a.log.Debug("daemon run ended", "run", o.runID, "took", time.Since(start))
	if res.User != "" {
		o.user = res.User
	}
	if res.Store != "" {
		o.store = res.Store
	}
	if res.Error == "" {
		return res.Outcome, nil
	}
	rerr := errors.New(res.Error)
	if res.CannotRun {
		return res.Outcome, fmt.Errorf("%w: %w", errCannotRun, rerr)
	}
	return res.Outcome, remoteRunError{rerr}
}

// remoteRunError is the daemon's error for a run that did not succeed: its
// text as the daemon wrote it, and errors.Is executor.ErrRunFailed.
type remoteRunError struct{ error }

// Is makes errors.Is(err, executor.ErrRunFailed) hold.
func (remoteRunError) Is(target error) bool { return target == executor.ErrRunFailed }

// runDetached starts the run as a live run on the daemon and prints its
// ID: it needs a daemon, and none of this host's machine flags.
func runDetached(ctx context.Context, a *app, o *runOptions) int {
	if err := o.checkRun(); err != nil {
		fmt.Fprintf(a.stderr, "taskrun run: %s\n", oneLine(err))
		return exitCannotRun
	}
	if o.local {
		return a.usageError("run", errors.New("--detach starts a live run on the taskrun daemon: drop --local"))
	}
	if f := o.machineFlag(); f != "" {
		return a.usageError("run", fmt.Errorf("--detach starts a live run on the taskrun daemon, which has its own %s: drop it", f))
	}
	c, err := daemon.DialFirst(ctx, daemon.ClientSocketPaths())
	if err != nil {
		fmt.Fprintf(a.stderr, "taskrun run: --detach needs a taskrun daemon: %s\n", oneLine(err))
		return exitCannotRun
	}
	defer c.Close()
	req, err := o.daemonRequest()
	if err == nil {
		err = c.Start(ctx, req, o.workspace)
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "taskrun run: live run %s: %s\n", o.runID, oneLine(err))
		return exitCannotRun
	}
	fmt.Fprintln(a.stdout, o.runID)
	if len(o.ports) == 0 {
		return exitOK
	}
	ports, err := c.Ports(ctx, o.runID)
	if err != nil {
		fmt.Fprintf(a.stderr, "taskrun run: live run %s: its ports: %s\n", o.runID, oneLine(err))
		return exitCannotRun
	}
	for _, p := range ports {
		fmt.Fprintf(a.stdout, "port %d %s %s\n", p.Port, p.Path, p.Token)
	}
	return exitOK
}
