package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/daemon"
)

const resumeHelp = `
Resumes a run of yours paused through this host's taskrun daemon
(taskrun pause) as a live run again: same tenant, run ID and policy, a
fresh uid, run directory, gateway and egress proxy. Its checkpoint is
checked first: one changed in the store, or another run's, is refused
and the run stays paused. A memory checkpoint goes on where it stopped;
a files-only one starts the run's command again in its kept home.
`

func init() {
	register(&command{
		Name:     "resume",
		Synopsis: "resume a run paused on the taskrun daemon",
		Args:     "RUN",
		Help:     resumeHelp,
		Flags: func(fs *pflag.FlagSet) action {
			return func(ctx context.Context, a *app, args []string) int {
				runID, ok := a.oneRunArg("resume", args)
				if !ok {
					return exitUsage
				}
				c, err := daemon.DialFirst(ctx, daemon.ClientSocketPaths())
				if err != nil {
					fmt.Fprintf(a.stderr, "taskrun resume: %s\n", oneLine(err))
					return exitFailure
				}
				defer c.Close()
				res, err := c.Resume(ctx, runID)
				if err != nil {
					fmt.Fprintf(a.stderr, "taskrun resume: %s\n", oneLine(err))
					return exitFailure
				}
				if res.Outcome != nil {
					fmt.Fprintf(a.stderr, "taskrun resume: run %s ended %s: %s\n", runID, res.Outcome.Status, res.Outcome.Reason)
					return exitFailure
				}
				fmt.Fprintln(a.stdout, runID)
				return exitOK
			}
		},
	})
}
