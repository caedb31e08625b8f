package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/taskrun/taskrun/sandbox/docker"
)

// runGC implements `taskrun gc [--dry-run] [--grace D] [--json]`: it removes
// managed containers that no live run owns.
func runGC(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("taskrun gc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dryRun := fs.Bool("dry-run", false, "list what would be removed without removing it")
	grace := fs.Duration("grace", docker.DefaultReapGrace, "spare containers created less than this long ago")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "taskrun gc: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	backend, err := docker.New(ctx, docker.WithLogger(log))
	if err != nil {
		fmt.Fprintln(stderr, "taskrun gc:", err)
		return exitCannotRun
	}
	defer backend.Close()
	rep, err := backend.Reap(ctx, docker.ReapOptions{Grace: *grace, DryRun: *dryRun})
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		verb := "removed"
		if *dryRun {
			verb = "would remove"
		}
		for _, c := range rep.Removed {
			fmt.Fprintf(stdout, "%s %.12s run=%s state=%s: %s\n", verb, c.ID, c.RunID, c.State, c.Reason)
		}
		fmt.Fprintf(stdout, "%s %d container(s), spared %d\n", verb, len(rep.Removed), rep.Spared)
	}
	if err != nil {
		fmt.Fprintln(stderr, "taskrun gc:", err)
		return exitFailure
	}
	return exitOK
}
