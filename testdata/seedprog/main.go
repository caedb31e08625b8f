// Command seedprog is a program that uses only the seed API: one task run
// through taskrun.RunTask on the local Docker engine, stored in a directory
// (file://), reported to the terminal. TestSeedProgram builds it in a
// module of its own that requires the checkout through a replace, and
// runs it: with only the seed's fields the run leases a host uid of its own
// and starts with the self-check, the program itself serving as the
// helpers when it is static, or is refused.
//
//	seedprog RUNS_ROOT STORE_DIR [IMAGE [COMMAND...]]
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/workerclient"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: seedprog RUNS_ROOT STORE_DIR [IMAGE [COMMAND...]]")
		os.Exit(2)
	}
	var image string
	var command []string
	if len(os.Args) > 3 {
		image, command = os.Args[3], os.Args[4:]
	}
	ctx := context.Background()
	store, err := persist.Open(ctx, "file://"+os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer store.Close()
	backend, err := docker.New(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	err = taskrun.RunTask(ctx, taskrun.RunTaskInput{
		Task:            &model.Task{ID: "t1", UserID: "u1", ConversationID: "c1"},
		Run:             &model.TaskRun{ID: "r1", TaskID: "t1"},
		SessionID:       "s1",
		Paths:           taskrun.NewRuntimePathsFromRoot(os.Args[1]),
		Persist:         store,
		ArtifactStorage: store,
		Updater:         workerclient.NewTerminalUpdater(os.Stdout),
		Sandbox:         backend,
		Image:           image,
		Command:         command,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
