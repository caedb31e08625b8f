package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/pflag"
)

const cancelHelp = `
Cancels a run of yours on a control plane (taskrun serve): a queued run ends
CANCELLED at once; a running one is flagged (cancel_requested) and stopped by
its worker, which still stores what the run produced. A run that already
ended is refused. Prints the run's status afterwards as JSON.
`

func init() {
	register(&command{
		Name:     "cancel",
		Synopsis: "cancel a run on a control plane (taskrun serve)",
		Args:     "RUN",
		Help:     cancelHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var api userAPIFlags
			api.define(fs)
			return func(ctx context.Context, a *app, args []string) int {
				runID, ok := a.oneRunArg("cancel", args)
				if !ok {
					return exitUsage
				}
				if api.server == "" {
					return a.usageError("cancel", errors.New("--server is required: a local taskrun run is cancelled with Ctrl-C (SIGINT) or SIGTERM"))
				}
				c, err := api.client()
				if err != nil {
					return a.usageError("cancel", err)
				}
				run, err := c.Cancel(ctx, runID)
				if err != nil {
					fmt.Fprintln(a.stderr, "taskrun cancel:", err)
					return exitFailure
				}
				status := map[string]any{"run": run.ID, "status": run.Status}
				if !run.Status.Terminal() {
					status["cancel_requested"] = run.CancelRequested
				}
				b, err := json.Marshal(status)
				if err != nil {
					fmt.Fprintln(a.stderr, "taskrun cancel:", err)
					return exitFailure
				}
				fmt.Fprintln(a.stdout, string(b))
				return exitOK
			}
		},
	})
}
