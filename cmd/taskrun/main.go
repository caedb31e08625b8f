// Command taskrun runs AI agents on tasks in fresh, hardened containers.
//
//	taskrun run [flags] [-- CMD ARGS...]   run one task in a sandbox
//	taskrun audit [CONTAINER...|--all]     check live containers against CIS §5 / PSS restricted
//	taskrun gc [--dry-run]                 remove containers no live run owns
//	taskrun persist --run-id R             upload a run kept after a store outage
//	taskrun images build                   build the run images offline
//	taskrun version                        print the version
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/taskrun/taskrun/helpers"
)

// Exit statuses, as `docker run` uses them.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitTimeout     = 124
	exitCannotRun   = 125
	exitInterrupted = 130
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// Run as taskrun-probe or taskrun-relay, the binary is that helper.
	if code, ok := helpers.Main(os.Args); ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand: it gets its own arguments and returns an exit status.
type command func(ctx context.Context, args []string, stdout, stderr io.Writer) int

var commands = map[string]command{
	"run":     runRun,
	"audit":   runAudit,
	"gc":      runGC,
	"persist": runPersist,
	"images":  runImages,
	"version": runVersion,
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "taskrun: unknown command %q; run `taskrun help` for the list\n", args[0])
		return exitUsage
	}
	return cmd(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `taskrun runs AI agents on tasks in fresh, hardened containers.

Usage:
  taskrun run [flags] [-- CMD ARGS...]   run one task in a sandbox (taskrun run -h for flags)
  taskrun audit [CONTAINER...|--all]     audit containers against CIS Docker §5 and PSS restricted
  taskrun gc [--dry-run]                 remove containers that no live run owns
  taskrun persist --run-id R             upload what a run kept on the host after a store outage
  taskrun images build                   build the run images offline (no registry)
  taskrun version                        print the version
`)
}

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) int {
	fmt.Fprintln(stdout, "taskrun", version)
	return exitOK
}
