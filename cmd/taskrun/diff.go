package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/runindex"
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
		Help:     diffHelp + runLookupHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				run     storedRunFlags
				jsonOut bool
			)
			run.define(fs)
			fs.BoolVar(&jsonOut, "json", false, "print changes.json (the list of changed paths) instead of the patch")
			return func(ctx context.Context, a *app, args []string) int {
				runID, ok := a.oneRunArg("diff", args)
				if !ok {
					return exitUsage
				}
				st, rec, code := run.openRun(ctx, a, "diff", runID)
				if st == nil {
					return code
				}
				defer st.Close()
				var rc io.ReadCloser
				var err error
				if jsonOut {
					rc, err = runindex.OpenChanges(ctx, st, rec)
				} else {
					rc, err = runindex.OpenPatch(ctx, st, rec)
				}
				if err != nil {
					return a.storeError("diff", err)
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
