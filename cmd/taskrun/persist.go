package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/workerclient"
)

// runPersist implements `taskrun persist --run-id R`: it uploads the local
// copy a run kept because its store was down, and reports the run again.
func runPersist(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("taskrun persist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	runID := fs.String("run-id", "", "the run whose kept local copy to persist (required)")
	root := fs.String("root", "./.taskrun/runtime", "host directory holding run directories, as given to `taskrun run`")
	store := fs.String("store", "file://./.taskrun/store", "blob store URL")
	user := fs.String("user", "local", "user (tenant) ID of the run")
	task := fs.String("task", "default", "task ID of the run")
	session := fs.String("session", "default", "session ID of the run")
	server := fs.String("server", "", "control plane base URL; without it the status goes to the terminal")
	token := fs.String("token", "", "bearer token for --server")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if *runID == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: taskrun persist --run-id RUN_ID [--root DIR] [--store URL] [--user ID] [--task ID] [--session ID]")
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	rootAbs, err := filepath.Abs(*root)
	if err != nil {
		fmt.Fprintln(stderr, "taskrun persist: --root:", err)
		return exitUsage
	}
	st, err := persist.Open(ctx, *store)
	if err != nil {
		fmt.Fprintln(stderr, "taskrun persist: --store:", err)
		return exitCannotRun
	}
	defer st.Close()
	in := taskrun.RunTaskInput{
		Task:            &model.Task{ID: *task, UserID: *user, ConversationID: cliConversation},
		Run:             &model.TaskRun{ID: *runID, TaskID: *task},
		SessionID:       *session,
		Paths:           taskrun.NewRuntimePathsFromRoot(rootAbs),
		Persist:         st,
		ArtifactStorage: st,
		Updater:         logUpdater{log: log},
		Logger:          log,
	}
	if *server != "" {
		in.Updater = workerclient.New(*server, *token)
	}
	out, err := taskrun.RetryPersist(ctx, in)
	writeSummary(stderr, *runID, *store, out)
	if err != nil {
		fmt.Fprintln(stderr, "taskrun persist:", oneLine(err))
		if out == nil {
			return exitCannotRun
		}
		return exitFailure
	}
	return exitOK
}
