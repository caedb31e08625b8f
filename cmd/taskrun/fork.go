package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/daemon"
)

const forkHelp = `
Starts N forks of a run of yours on this host's taskrun daemon, each a
live run of its own (its own run ID, uid, records and change set against
the original workspace) whose records name RUN as its parent. A live
RUN keeps running, unaffected: the forks start their command again in a
copy of its home as it is now. A paused RUN (taskrun pause) is forked
from its checkpoint: with a memory checkpoint (gVisor) every fork goes
on where RUN stopped. Its checkpoint is checked first: one changed in the
store, or another run's or tenant's, is refused. Prints one fork's run ID
a line.
`

func init() {
	register(&command{
		Name:     "fork",
		Synopsis: "start N forks of a live or paused run on the taskrun daemon",
		Args:     "RUN",
		Help:     forkHelp,
		Flags: func(fs *pflag.FlagSet) action {
			n := fs.IntP("number", "n", 1, fmt.Sprintf("how many forks (1 to %d)", daemon.MaxForks))
			prompt := fs.String("prompt", "", "the forks' prompt, instead of the parent's")
			return func(ctx context.Context, a *app, args []string) int {
				runID, ok := a.oneRunArg("fork", args)
				if !ok {
					return exitUsage
				}
				if *n < 1 || *n > daemon.MaxForks {
					fmt.Fprintf(a.stderr, "taskrun fork: -n %d: give 1 to %d\n", *n, daemon.MaxForks)
					return exitUsage
				}
				c, err := daemon.DialFirst(ctx, daemon.ClientSocketPaths())
				if err != nil {
					fmt.Fprintf(a.stderr, "taskrun fork: %s\n", oneLine(err))
					return exitFailure
				}
				defer c.Close()
				res, err := c.Fork(ctx, runID, daemon.ForkRequest{N: *n, Prompt: *prompt})
				if err != nil {
					fmt.Fprintf(a.stderr, "taskrun fork: %s\n", oneLine(err))
					return exitFailure
				}
				code := exitOK
				for _, f := range res.Forks {
					if r := f.Result; r != nil {
						msg := r.Error
						if r.Outcome != nil {
							msg = fmt.Sprintf("%s: %s", r.Outcome.Status, r.Outcome.Reason)
						}
						fmt.Fprintf(a.stderr, "taskrun fork: fork %s of %s ended before it ran: %s\n", f.RunID, runID, oneLine(fmt.Errorf("%s", msg)))
						code = exitFailure
						continue
					}
					fmt.Fprintln(a.stdout, f.RunID)
				}
				return code
			}
		},
	})
}
