package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

const diffHelp = `
Prints the patch of what the run changed in its workspace (changes.patch), in
git's format: pipe it to 'git apply', or use 'taskrun apply RUN DIR'. --json
prints changes.json instead: every changed path with its kind, modes, sizes
and SHA-256, the base commit and the final tree's hash.
`

func init() {
	register(&command{
		Name:     "diff",
		Synopsis: "print what a run changed in its workspace, as a git patch",
		Args:     "RUN",
		Help:     diffHelp + runLookupHelp + serverReadHelp + daemonReadHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				run     readRunFlags
				jsonOut bool
			)
			run.define(fs)
			fs.BoolVar(&jsonOut, "json", false, "print changes.json (the list of changed paths) instead of the patch")
			return func(ctx context.Context, a *app, args []string) int {
				runID, ok := a.oneRunArg("diff", args)
				if !ok {
					return exitUsage
				}
				rr, code := run.open(ctx, a, "diff", runID)
				if rr == nil {
					return code
				}
				defer rr.Close()
				var rc io.ReadCloser
				var err error
				if jsonOut {
					rc, err = rr.openChanges(ctx)
				} else {
					rc, err = rr.openPatch(ctx)
				}
				if err != nil {
					return a.readError("diff", err)
				}
				defer rc.Close()
				out, flush := a.terminalSafe(a.stdout)
				defer flush()
				if _, err := io.Copy(out, rc); err != nil {
					fmt.Fprintln(a.stderr, "taskrun diff:", err)
					return exitFailure
				}
				return exitOK
			}
		},
	})
}
