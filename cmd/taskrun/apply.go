package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/termsafe"
)

const applyHelp = `
Applies the run's changes.patch to DIR, a copy of the workspace the run
started from (for a git workspace, a checkout of the base commit that
'taskrun diff --json' names), with the host's 'git apply'. Nothing changes
unless every hunk applies.
`

func init() {
	register(&command{
		Name:     "apply",
		Synopsis: "apply what a run changed to a checkout of its workspace",
		Args:     "RUN DIR",
		Help:     applyHelp + runLookupHelp + serverReadHelp + daemonReadHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var run readRunFlags
			run.define(fs)
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) != 2 {
					return a.usageError("apply", errors.New("name a run and a directory: taskrun apply RUN DIR"))
				}
				rr, code := run.open(ctx, a, "apply", args[0])
				if rr == nil {
					return code
				}
				defer rr.Close()
				rec := rr.rec
				rc, err := rr.openPatch(ctx)
				if err != nil {
					return a.readError("apply", err)
				}
				defer rc.Close()
				if err := changeset.Apply(ctx, args[1], rc); err != nil {
					fmt.Fprintln(a.stderr, "taskrun apply:", termsafe.String(err.Error()))
					return exitFailure
				}
				if !a.quiet {
					fmt.Fprintf(a.stderr, "applied the changes of run %s to %s\n", rec.RunID, termsafe.String(args[1]))
				}
				return exitOK
			}
		},
	})
}
