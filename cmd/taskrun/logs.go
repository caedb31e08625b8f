package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
)

const logsHelp = `
Prints a run's output log (the agent's stdout) from the store, or its stderr
log with --stderr. Printed to a terminal, control characters and escape
sequences are shown escaped; piped, the log is byte-exact.
`

func init() {
	register(&command{
		Name:     "logs",
		Synopsis: "print a run's output log (--stderr: its stderr)",
		Args:     "RUN",
		Help:     logsHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				run    storedRunFlags
				stderr bool
			)
			run.define(fs)
			fs.BoolVar(&stderr, "stderr", false, "print the stderr log instead of the output log")
			return func(ctx context.Context, a *app, args []string) int {
				runID, ok := a.oneRunArg("logs", args)
				if !ok {
					return exitUsage
				}
				st, rec, code := run.openRun(ctx, a, "logs", runID)
				if st == nil {
					return code
				}
				defer st.Close()
				out, flush := a.terminalSafe(a.stdout)
				defer flush()
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
