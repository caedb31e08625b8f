package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/daemon"
)

const stopHelp = `
Stops a live run of yours on this host's taskrun daemon (taskrun run
--detach): its container is stopped and the run is stored as any run, its
status CANCELLED. Another user's run is not found.
`

func init() {
	register(&command{
		Name:     "stop",
		Synopsis: "stop a live run on the taskrun daemon",
		Args:     "RUN",
		Help:     stopHelp,
		Flags: func(fs *pflag.FlagSet) action {
			return func(ctx context.Context, a *app, args []string) int {
				runID, ok := a.oneRunArg("stop", args)
				if !ok {
					return exitUsage
				}
				c, err := daemon.DialFirst(ctx, daemon.ClientSocketPaths())
				if err == nil {
					defer c.Close()
					err = c.Stop(ctx, runID)
				}
				if err != nil {
					fmt.Fprintf(a.stderr, "taskrun stop: %s\n", oneLine(err))
					return exitFailure
				}
				return exitOK
			}
		},
	})
}
