// Command taskrun runs AI agents on tasks in fresh, hardened containers.
//
// Each subcommand lives in its own file and registers itself in the table of
// commands (see command.go); `taskrun help` lists them.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
