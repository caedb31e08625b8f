package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/recovery"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/sandbox/kubernetes"
)

const gcHelp = `
First recovers the runs under --root whose executor is gone (killed, crashed,
or the host rebooted): stops each one's container, saves what the agent printed
after the executor died, stores everything, reports FAILED "executor lost" to
the run's control plane and releases the run dir, its loop mount and image. A
run whose store still fails is kept on the host, holding no mount, for
taskrun persist --all.

Then removes managed containers (label dev.taskrun.managed=true) that no live
run owns: those of executors proven gone, or with --all of every executor on
the host (exited ones, and running ones past their expiry). Containers created
less than --grace ago are spared. With --namespace, does the same for the run
Pods (and their NetworkPolicies) in that Kubernetes namespace. Last, removes
the warm pool slots (run directories and disk caps under --root's pool/) that
gone executors left.
--dry-run lists what would be done, and which runs are kept and why.
`

func init() {
	register(&command{
		Name:     "gc",
		Synopsis: "recover runs whose executor is gone; remove containers that no live run owns",
		Help:     gcHelp,
		Flags: func(fs *pflag.FlagSet) action {
			dryRun := fs.Bool("dry-run", false, "list what would be recovered or removed, and which runs are kept and why, without changing anything")
			grace := fs.Duration("grace", docker.DefaultReapGrace, "spare containers created less than this long ago")
			jsonOut := fs.Bool("json", false, "print the report as JSON")
			all := fs.Bool("all", false, "remove leftover containers of every executor on the host, not only of gone ones")
			var root, token string
			var key attestKeyFlag
			var kube gcKubeFlags
			kube.define(fs)
			addTokenFlag(fs, &token)
			addRootFlag(fs, &root, defaultRoot)
			key.define(fs)
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) > 0 {
					return a.usageError("gc", fmt.Errorf("unexpected argument %q", args[0]))
				}
				if err := key.load(); err != nil {
					return a.usageError("gc", err)
				}
				return runGC(ctx, a, root, tokenOrEnv(token), key.signer, kube, *grace, *all, *dryRun, *jsonOut)
			}
		},
	})
}

// gcReport is what `taskrun gc --json` prints.
type gcReport struct {
	Runs       []recovery.Result `json:"runs"`
	Containers docker.ReapReport `json:"containers"`
	// Pods are the run Pods removed with --namespace.
	Pods kubernetes.ReapReport `json:"pods"`
}

// runGC recovers the root's runs whose executor is gone, then removes
// managed containers that no live run owns.
func runGC(ctx context.Context, a *app, root, token string, key *attest.Signer, kube gcKubeFlags, grace time.Duration, all, dryRun, jsonOut bool) int {
	host, err := recoveryHost(ctx, a, root, token, key)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun gc:", err)
		return exitUsage
	}
	backend, err := docker.New(ctx, docker.WithLogger(a.log))
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun gc:", err)
		return exitCannotRun
	}
	defer backend.Close()
	var lines io.Writer = a.stdout
	if jsonOut {
		lines = io.Discard
	}
	var rep gcReport
	var recoverErr error
	rep.Runs, recoverErr = host.RecoverRuns(ctx, backend, dryRun, lines)
	rep.Containers, err = backend.Reap(ctx, host.ReapOptions(grace, all, dryRun, rep.Runs))
	var podErr error
	rep.Pods, podErr = kube.reap(ctx, a, host, grace, all, dryRun)
	err = errors.Join(err, podErr)
	if !dryRun {
		err = errors.Join(err, host.SweepPools(), host.SweepImages())
		host.RemoveGoneExecutors()
	}
	if jsonOut {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		verb := "removed"
		if dryRun {
			verb = "would remove"
		}
		for _, c := range rep.Containers.Removed {
			fmt.Fprintf(a.stdout, "%s %.12s run=%s state=%s: %s\n", verb, c.ID, c.RunID, c.State, c.Reason)
		}
		fmt.Fprintf(a.stdout, "%s %d container(s), spared %d\n", verb, len(rep.Containers.Removed), rep.Containers.Spared)
		if kube.namespace != "" {
			for _, p := range rep.Pods.Removed {
				fmt.Fprintf(a.stdout, "%s pod %s run=%s phase=%s: %s\n", verb, p.Name, p.RunID, p.Phase, p.Reason)
			}
			for _, l := range rep.Pods.Leases {
				fmt.Fprintf(a.stdout, "%s lease %s: expired, no pod\n", verb, l)
			}
			fmt.Fprintf(a.stdout, "%s %d pod(s), spared %d\n", verb, len(rep.Pods.Removed), rep.Pods.Spared)
		}
	}
	if err = errors.Join(recoverErr, err); err != nil {
		fmt.Fprintln(a.stderr, "taskrun gc:", oneLine(err))
		return exitFailure
	}
	return exitOK
}

// recoveryHost is the host of the runs under root for gc and persist: no
// backend or store of its own, each recovered run's store and control plane
// come from its journal record; token is the control plane token for
// records that name none, key signs the recovered runs' attestations.
func recoveryHost(ctx context.Context, a *app, root, token string, key *attest.Signer) (*executor.Host, error) {
	return executor.New(ctx, executor.Config{Root: root, Token: token, AttestKey: key, Version: version, Logger: a.log})
}

// tokenOrEnv is token, or $TASKRUN_TOKEN when it is empty.
func tokenOrEnv(token string) string {
	if token != "" {
		return token
	}
	return os.Getenv(envToken)
}
