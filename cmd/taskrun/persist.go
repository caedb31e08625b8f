package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/termsafe"
	"github.com/taskrun/taskrun/workerclient"
)

const persistHelp = `
When the store fails at the end of a run, the run keeps its directory on the
host and reports FAILED. Once the store works again, this uploads what the run
kept and reports the run again. Name the run as taskrun run did: the same
--root, --store and IDs; or give --all to retry every kept run under --root,
each with the store and control plane it ran with (runs whose executor died are
recovered first, as taskrun gc does).
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
				key         attestKeyFlag
				root, store string
			)
			ref.define(fs, "the run whose kept local copy to persist (required)")
			srv.define(fs)
			key.define(fs)
			addRootFlag(fs, &root, defaultRoot)
			addStoreFlag(fs, &store)
			all := fs.Bool("all", false, "retry every kept run under --root, each with its own store and control plane")
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) > 0 {
					return a.usageError("persist", fmt.Errorf("unexpected argument %q", args[0]))
				}
				if *all {
					if ref.runID != "" {
						return a.usageError("persist", fmt.Errorf("give --run-id or --all, not both"))
					}
					if err := key.load(); err != nil {
						return a.usageError("persist", err)
					}
					return persistAll(ctx, a, root, tokenOrEnv(srv.token), key.signer)
				}
				if ref.runID == "" {
					return a.usageError("persist", fmt.Errorf("--run-id is required (or --all)"))
				}
				if err := ref.validate(); err != nil {
					return a.usageError("persist", err)
				}
				if err := srv.check(); err != nil {
					return a.usageError("persist", err)
				}
				if err := key.load(); err != nil {
					return a.usageError("persist", err)
				}
				return runPersist(ctx, a, ref, srv, root, store, key.signer)
			}
		},
	})
}

// runPersist uploads the local copy a run kept because its store was down.
func runPersist(ctx context.Context, a *app, ref runRefFlags, srv serverFlags, root, store string, key *attest.Signer) int {
	st, err := persist.Open(ctx, store)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun persist: --store:", err)
		return exitCannotRun
	}
	defer st.Close()
	host, err := executor.New(ctx, executor.Config{Root: root, Store: st, AttestKey: key, Version: version, Logger: a.log})
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun persist: --root:", err)
		return exitUsage
	}
	spec := executor.Spec{
		Task:      &model.Task{ID: ref.task, UserID: ref.user, ConversationID: ref.conversation},
		Run:       &model.TaskRun{ID: ref.runID, TaskID: ref.task},
		SessionID: ref.session,
		Updater:   executor.LogUpdater{Log: a.log},
	}
	if srv.server != "" {
		spec.Updater = workerclient.New(srv.server, srv.token)
	}
	out, err := host.RetryPersist(ctx, spec)
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

// persistAll recovers the runs whose executor is gone, then retries every
// kept run under root once.
func persistAll(ctx context.Context, a *app, root, token string, key *attest.Signer) int {
	host, err := recoveryHost(ctx, a, root, token, key)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun persist:", err)
		return exitUsage
	}
	// Without Docker, runs that still have a container wait for taskrun gc.
	backend, berr := docker.New(ctx, docker.WithLogger(a.log))
	if berr == nil {
		defer backend.Close()
	} else {
		backend = nil
		a.log.Warn("no container engine; runs whose container is left wait for taskrun gc", "err", berr)
	}
	_, recoverErr := host.RecoverRuns(ctx, backend, false, a.stdout)
	still, err := host.RetryKeptRuns(ctx, a.stdout)
	fmt.Fprintf(a.stdout, "%d run(s) still kept\n", still)
	if err = errors.Join(recoverErr, err); err != nil {
		fmt.Fprintln(a.stderr, "taskrun persist:", termsafe.String(oneLine(err)))
		return exitFailure
	}
	return exitOK
}
