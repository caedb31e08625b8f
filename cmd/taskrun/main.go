// Command taskrun runs AI agents on tasks in fresh, hardened containers.
//
// Each subcommand lives in its own file and registers itself in the table of
// commands (see command.go); `taskrun help` lists them.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/taskrun/taskrun/helpers"
	// The s3:// store driver (persist.Open); file:// and mem:// are built in.
	_ "github.com/taskrun/taskrun/persist/s3"
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

// secondSignalNote, when set (a string), replaces what the second
// signal's message says happens to the command's work.
var secondSignalNote atomic.Value

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// Run as taskrun-probe or taskrun-relay, the binary is that helper.
	if code, ok := helpers.Main(os.Args); ok {
		os.Exit(code)
	}
	// The first SIGINT or SIGTERM cancels the command (a run winds down
	// within --shutdown-grace); a second one exits at once. Every journal
	// write is atomic, so the journal stays whole either way.
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		cancel()
		<-sigs
		if note, _ := secondSignalNote.Load().(string); note != "" {
			fmt.Fprintln(os.Stderr, "taskrun: second signal: exiting now; "+note)
		} else {
			fmt.Fprintln(os.Stderr, "taskrun: second signal: exiting now; taskrun gc finishes what the journal holds")
		}
		os.Exit(exitInterrupted)
	}()
	shutdownBackstop = func(grace time.Duration, stderr io.Writer) {
		time.AfterFunc(grace, func() {
			fmt.Fprintf(stderr, "taskrun: the run did not wind down within --shutdown-grace %s: exiting; taskrun gc finishes what the journal holds\n", grace)
			os.Exit(exitInterrupted)
		})
	}
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}
