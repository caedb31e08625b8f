package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/images"
)

func init() {
	register(&command{
		Name:     "images",
		Synopsis: "build the run images offline (no registry)",
		Args:     "build",
		Help: `
taskrun images build makes ` + images.AgentRef + ` from the static taskrun-agent
next to taskrun (or in --bin-dir), ` + images.PodHelperRef + ` (the helper of runs on
Kubernetes) from the static taskrun-pod there, and with --testbox also ` + images.TestboxRef + `
from the host's static busybox. Nothing is pulled from a registry.
`,
		Flags: func(fs *pflag.FlagSet) action {
			binDir := fs.String("bin-dir", executableDir(), "directory holding the static taskrun-agent and taskrun-pod binaries")
			testbox := fs.Bool("testbox", false, "also build "+images.TestboxRef+" from the host's static busybox")
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) != 1 || args[0] != "build" {
					return a.usageError("images", fmt.Errorf("the only subcommand is build: taskrun images build [--bin-dir DIR] [--testbox]"))
				}
				return runImagesBuild(ctx, a, *binDir, *testbox)
			}
		},
	})
}

func runImagesBuild(ctx context.Context, a *app, binDir string, testbox bool) int {
	defs := []func() (images.Definition, error){
		func() (images.Definition, error) { return images.Agent(binDir) },
		func() (images.Definition, error) { return images.PodHelper(binDir) },
	}
	if testbox {
		defs = append(defs, images.Testbox)
	}
	cli, err := images.NewDockerClient()
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun images build:", err)
		return exitCannotRun
	}
	defer cli.Close()
	var progress io.Writer = a.stderr
	if a.quiet {
		progress = io.Discard
	}
	builder := images.NewBuilder(cli, progress)
	for _, def := range defs {
		d, err := def()
		if err == nil {
			err = builder.Build(ctx, d)
		}
		if err != nil {
			fmt.Fprintln(a.stderr, "taskrun images build:", err)
			return exitCannotRun
		}
		fmt.Fprintln(a.stdout, d.Ref)
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
