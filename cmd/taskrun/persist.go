package main

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/termsafe"
	"github.com/taskrun/taskrun/workerclient"
)

const persistHelp = `
When the store fails at the end of a run, the run keeps its directory on the
host and reports FAILED. Once the store works again, this uploads what the run
kept and reports the run again. Name the run as taskrun run did: the same
--root, --store and IDs.
`

func init() {
	register(&command{
		Name:     "persist",
		Synopsis: "upload what a run kept on the host after a store outage",
		Help:     persistHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				ref         runRefFlags
				srv         serverFlags
				root, store string
			)
			ref.define(fs, "the run whose kept local copy to persist (required)")
			srv.define(fs)
			addRootFlag(fs, &root, defaultRoot)
			addStoreFlag(fs, &store)
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) > 0 {
					return a.usageError("persist", fmt.Errorf("unexpected argument %q", args[0]))
				}
				if ref.runID == "" {
					return a.usageError("persist", fmt.Errorf("--run-id is required"))
				}
				if err := ref.validate(); err != nil {
					return a.usageError("persist", err)
				}
				if err := srv.check(); err != nil {
					return a.usageError("persist", err)
				}
				return runPersist(ctx, a, ref, srv, root, store)
			}
		},
	})
}

// runPersist uploads the local copy a run kept because its store was down.
func runPersist(ctx context.Context, a *app, ref runRefFlags, srv serverFlags, root, store string) int {
	rootAbs, err := filepath.Abs(root)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun persist: --root:", err)
		return exitUsage
	}
	st, err := persist.Open(ctx, store)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun persist: --store:", err)
		return exitCannotRun
	}
	defer st.Close()
	in := taskrun.RunTaskInput{
		Task:            &model.Task{ID: ref.task, UserID: ref.user, ConversationID: ref.conversation},
		Run:             &model.TaskRun{ID: ref.runID, TaskID: ref.task},
		SessionID:       ref.session,
		Paths:           taskrun.NewRuntimePathsFromRoot(rootAbs),
		Persist:         st,
		ArtifactStorage: st,
		Updater:         logUpdater{log: a.log},
		Logger:          a.log,
	}
	if srv.server != "" {
		in.Updater = workerclient.New(srv.server, srv.token)
	}
	out, err := taskrun.RetryPersist(ctx, in)
	code := exitOK
	if err != nil {
		code = exitFailure
		if out == nil {
			code = exitCannotRun
		}
	}
	if !a.quiet {
		writeSummary(a.stderr, ref, store, out, code)
	}
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun persist:", termsafe.String(oneLine(err)))
	}
	return code
}
