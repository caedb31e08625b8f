package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/spool"
	"github.com/taskrun/taskrun/workspace"
)

const logsHelp = `
Prints a run's output log (the agent's stdout) from the store, or its stderr
log with --stderr. With --follow, a run still in progress on this host is
followed from the executor's spool under --root until it ends; a finished run
is printed from the store. Printed to a terminal, control characters and
escape sequences are shown escaped.
`

// followPoll is how often --follow checks for new output.
const followPoll = 200 * time.Millisecond

// followRecheck is how often --follow re-reads the run's record.
const followRecheck = 2 * time.Second

func init() {
	register(&command{
		Name:     "logs",
		Synopsis: "print a run's output log (--stderr: its stderr), --follow a live run",
		Args:     "RUN",
		Help:     logsHelp + runLookupHelp + daemonReadHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				run            storedRunFlags
				root           string
				stderr, follow bool
				api            userAPIFlags
				via            daemonReadFlags
			)
			run.define(fs)
			api.define(fs)
			via.define(fs)
			addRootFlag(fs, &root, defaultRoot)
			fs.BoolVar(&stderr, "stderr", false, "print the stderr log instead of the output log")
			fs.BoolVarP(&follow, "follow", "f", false, "keep printing a live run's output until it ends")
			return func(ctx context.Context, a *app, args []string) int {
				runID, ok := a.oneRunArg("logs", args)
				if !ok {
					return exitUsage
				}
				if api.server != "" {
					if stderr {
						return a.usageError("logs", errors.New("--stderr: a control plane holds only the output stream"))
					}
					return remoteLogs(ctx, a, api, runID, follow)
				}
				c, code := via.dial(ctx, a, "logs")
				if code != exitOK {
					return code
				}
				if c != nil {
					defer c.Close()
					return daemonLogs(ctx, a, c, runID, run.user, stderr, follow)
				}
				st, rec, code := run.openRun(ctx, a, "logs", runID)
				if st == nil {
					return code
				}
				defer st.Close()
				out, flush := a.terminalSafe(a.stdout)
				defer flush()
				if follow && rec.Status == model.StatusRunning {
					return followLive(ctx, a, st, rec, root, stderr, out)
				}
				return printLog(ctx, a, st, rec, stderr, out)
			}
		},
	})
}

func printLog(ctx context.Context, a *app, st *persist.Store, rec *runindex.Record, stderr bool, out io.Writer) int {
	rc, err := runindex.OpenLog(ctx, st, rec, stderr)
	if err != nil {
		return a.storeError("logs", err)
	}
	defer rc.Close()
	if _, err := io.Copy(out, rc); err != nil {
		fmt.Fprintln(a.stderr, "taskrun logs:", err)
		return exitFailure
	}
	return exitOK
}

// followLive follows the spool of a run in progress on this host.
func followLive(ctx context.Context, a *app, st *persist.Store, rec *runindex.Record, root string, stderr bool, out io.Writer) int {
	host, _ := os.Hostname()
	if rec.Host != "" && rec.Host != host {
		fmt.Fprintf(a.stderr, "taskrun logs: run %s is in progress on host %s: follow it there\n", rec.RunID, rec.Host)
		return exitUsage
	}
	rootAbs, err := filepath.Abs(root)
	if err != nil {
		return a.usageError("logs", fmt.Errorf("--root: %w", err))
	}
	path, err := executor.SpoolPath(workspace.NewPaths(rootAbs), rec.Ref(), stderr)
	if err != nil {
		return a.storeError("logs", err)
	}
	lastCheck := time.Now()
	done := func() bool {
		if time.Since(lastCheck) < followRecheck {
			return false
		}
		lastCheck = time.Now()
		now, err := runindex.Find(ctx, st, rec.RunID, rec.UserID)
		return err == nil && now.Status.Terminal()
	}
	_, err = spool.FollowFile(ctx, path, out, followPoll, done)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return spoolMissing(ctx, a, st, rec, rootAbs, stderr, out)
	case errors.Is(err, context.Canceled):
		return exitInterrupted
	case err != nil:
		fmt.Fprintln(a.stderr, "taskrun logs:", err)
		return exitFailure
	}
	return exitOK
}

// spoolGoneWait is how long --follow waits, when a live run's spool is not
// where --root says, for the run's record to say it ended (its spool is
// removed a moment before) before it blames --root.
const spoolGoneWait = 10 * time.Second

// spoolMissing handles a live run without a spool under root: the run has
// just ended (its stored log is printed once its record says so), or root is
// not the run's, which the message names.
func spoolMissing(ctx context.Context, a *app, st *persist.Store, rec *runindex.Record, root string, stderr bool, out io.Writer) int {
	deadline := time.Now().Add(spoolGoneWait)
	for {
		now, err := runindex.Find(ctx, st, rec.RunID, rec.UserID)
		if err != nil {
			return a.storeError("logs", err)
		}
		if now.Status.Terminal() {
			return printLog(ctx, a, st, now, stderr, out)
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(a.stderr, "taskrun logs: run %s is in progress on this host, but not under --root %s: give the --root it was started with (taskrun run --root), or wait for it to end to print its stored log\n", rec.RunID, root)
			return exitUsage
		}
		select {
		case <-ctx.Done():
			return exitInterrupted
		case <-time.After(followRecheck):
		}
	}
}

// remoteLogs prints (or follows) a run's output from the control plane.
func remoteLogs(ctx context.Context, a *app, api userAPIFlags, runID string, follow bool) int {
	c, err := api.client()
	if err != nil {
		return a.usageError("logs", err)
	}
	rc, err := c.Output(ctx, runID, 0, follow)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun logs:", err)
		return exitFailure
	}
	defer rc.Close()
	out, flush := a.terminalSafe(a.stdout)
	defer flush()
	if _, err := io.Copy(out, rc); err != nil && ctx.Err() == nil {
		fmt.Fprintln(a.stderr, "taskrun logs:", err)
		return exitFailure
	}
	return exitOK
}

// daemonLogs prints (or follows) a run's log through the taskrun daemon.
func daemonLogs(ctx context.Context, a *app, c *daemon.Client, runID, user string, stderr, follow bool) int {
	rc, err := c.OpenLog(ctx, runID, user, stderr, follow)
	if err != nil {
		return a.daemonError("logs", err)
	}
	defer rc.Close()
	out, flush := a.terminalSafe(a.stdout)
	defer flush()
	if _, err := io.Copy(out, rc); err != nil {
		if ctx.Err() != nil {
			return exitInterrupted
		}
		fmt.Fprintln(a.stderr, "taskrun logs:", err)
		return exitFailure
	}
	return exitOK
}
