// Command seedprog is a program that uses only the seed API: one task run
// through taskrun.RunTask on the local Docker engine, stored in a directory
// (file://), reported to the terminal. TestSeedProgram builds it in a
// module of its own that requires the checkout through a replace.
//
//	seedprog RUNS_ROOT STORE_DIR
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
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: seedprog RUNS_ROOT STORE_DIR")
		os.Exit(2)
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
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
