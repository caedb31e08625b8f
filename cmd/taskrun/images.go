package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/taskrun/taskrun/images"
)

// runImages implements `taskrun images build [--bin-dir DIR] [--testbox]`.
func runImages(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(stderr, "usage: taskrun images build [--bin-dir DIR] [--testbox]")
		return exitUsage
	}
	fs := flag.NewFlagSet("taskrun images build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	binDir := fs.String("bin-dir", executableDir(), "directory holding the static taskrun-agent binary")
	testbox := fs.Bool("testbox", false, "also build "+images.TestboxRef+" from the host's static busybox")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	defs := []func() (images.Definition, error){func() (images.Definition, error) { return images.Agent(*binDir) }}
	if *testbox {
		defs = append(defs, images.Testbox)
	}
	cli, err := images.NewDockerClient()
	if err != nil {
		fmt.Fprintln(stderr, "taskrun images build:", err)
		return exitCannotRun
	}
	defer cli.Close()
	builder := images.NewBuilder(cli, stderr)
	for _, def := range defs {
		d, err := def()
		if err == nil {
			err = builder.Build(ctx, d)
		}
		if err != nil {
			fmt.Fprintln(stderr, "taskrun images build:", err)
			return exitCannotRun
		}
		fmt.Fprintln(stdout, d.Ref)
	}
	return exitOK
}

// executableDir is the directory of the running taskrun binary, where the
// build puts its static companions.
func executableDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "."
	}
	return filepath.Dir(exe)
}
