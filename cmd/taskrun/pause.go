package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/sandbox"
)

const pauseHelp = `
Pauses a live run of yours on this host's taskrun daemon (taskrun run
--detach): its sandbox is checkpointed and the checkpoint stored with the
run (checkpoint/checkpoint.tar.zst), the run's outputs are stored as at
any run's end, the host frees everything it held for it, and its status
becomes PAUSED. With gVisor and the restore runtime the checkpoint keeps
the sandbox's memory; elsewhere (runc) it keeps the run's files only, and
pause says so. Another user's run is not found.
`

func init() {
	register(&command{
		Name:     "pause",
		Synopsis: "pause a live run on the taskrun daemon, storing its checkpoint",
		Args:     "RUN",
		Help:     pauseHelp,
		Flags: func(fs *pflag.FlagSet) action {
			return func(ctx context.Context, a *app, args []string) int {
				runID, ok := a.oneRunArg("pause", args)
				if !ok {
					return exitUsage
				}
				c, err := daemon.DialFirst(ctx, daemon.ClientSocketPaths())
				if err != nil {
					fmt.Fprintf(a.stderr, "taskrun pause: %s\n", oneLine(err))
					return exitFailure
				}
				defer c.Close()
				out, err := c.Pause(ctx, runID)
				if err != nil {
					fmt.Fprintf(a.stderr, "taskrun pause: %s\n", oneLine(err))
					return exitFailure
				}
				fmt.Fprintf(a.stdout, "run %s %s: %s\n", runID, out.Status, out.Reason)
				if m := out.Checkpoint; m != nil {
					fmt.Fprintf(a.stdout, "checkpoint: %s, %d bytes, keeps %s\n", m.Digest, m.Size, m.Kind)
					if m.Kind != sandbox.CheckpointMemory {
						fmt.Fprintln(a.stdout, "this backend keeps no memory of the run's runtime: only its files are kept, and a resume starts its command again")
					}
				}
				return exitOK
			}
		},
	})
}
