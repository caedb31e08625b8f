package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/sandbox/docker"
)

func init() {
	register(&command{
		Name:     "gc",
		Synopsis: "remove containers that no live run owns",
		Help: `
Removes managed containers (label dev.taskrun.managed=true) that no live run
owns: exited ones, and those whose run's executor is gone. Containers created
less than --grace ago are spared.
`,
		Flags: func(fs *pflag.FlagSet) action {
			dryRun := fs.Bool("dry-run", false, "list what would be removed without removing it")
			grace := fs.Duration("grace", docker.DefaultReapGrace, "spare containers created less than this long ago")
			jsonOut := fs.Bool("json", false, "print the report as JSON")
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) > 0 {
					return a.usageError("gc", fmt.Errorf("unexpected argument %q", args[0]))
				}
				return runGC(ctx, a, docker.ReapOptions{Grace: *grace, DryRun: *dryRun}, *jsonOut)
			}
		},
	})
}

// runGC removes managed containers that no live run owns.
func runGC(ctx context.Context, a *app, opts docker.ReapOptions, jsonOut bool) int {
	backend, err := docker.New(ctx, docker.WithLogger(a.log))
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun gc:", err)
		return exitCannotRun
	}
	defer backend.Close()
	rep, err := backend.Reap(ctx, opts)
	if jsonOut {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		verb := "removed"
		if opts.DryRun {
			verb = "would remove"
		}
		for _, c := range rep.Removed {
			fmt.Fprintf(a.stdout, "%s %.12s run=%s state=%s: %s\n", verb, c.ID, c.RunID, c.State, c.Reason)
		}
		fmt.Fprintf(a.stdout, "%s %d container(s), spared %d\n", verb, len(rep.Removed), rep.Spared)
	}
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun gc:", err)
		return exitFailure
	}
	return exitOK
}
