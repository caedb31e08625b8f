package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/docker/go-units"
	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/sandbox"
)

const daemonHelp = `
Runs this host's resident executor: one process holding the runs root, the
store, the backend and the helpers, serving local clients on a unix socket
($TASKRUN_HOST, else ` + daemon.RootSocket + ` as root, else
$XDG_RUNTIME_DIR/taskrun.sock). While it answers there, taskrun run is its
thin client: same flags, same streamed output, same exit status, same
stored objects; taskrun run --local runs in its own process instead. At
start it recovers what a killed daemon (or any gone executor of --root)
left, as taskrun gc does. Under systemd socket activation (LISTEN_FDS, a
taskrun.socket unit: see examples/systemd) it serves the one unix socket
systemd passed instead of binding its own.

The socket is open to every local user (mode 0666) and is not
root-equivalent: each connection's peer uid (SO_PEERCRED) is its tenant,
the uid's user name. A client runs as its tenant only (root may name any
--user); its limits are refused over the --max-run-* maxima; its egress can
only narrow this daemon's --allow and --egress-policy (none given: runs
have no network) and names credentials only by the id a --credential gives
it for that tenant; its model is scripted or this daemon's --model; its
image must be local (--pull never) unless the operator sets --pull. The
client sends its workspace's bytes, read as itself: the daemon never reads
a path for a client.

--warm N keeps N containers of the default --image, --runtime and policy
started ahead of the runs, parked at the self-check, as taskrun worker
--warm does: a client's run that asks for no other image or limits takes
one. With --warm-budget SIZE the pool is sized from recent demand instead:
each image, runtime and policy that clients' runs asked for in the last
minute keeps as many containers as it had runs, at least one (the default
run's too), at most N in all, and the containers' --memory limits within
SIZE; when demand is over the budget, the most asked-for go first. They
are removed when the daemon stops.

taskrun run --detach starts a live run: its container idles until taskrun
stop RUN, or --max-idle with no call on it, or its run timeout; meanwhile
its tenant runs commands in it through the socket (see docs/live-runs.md).

SIGTERM or SIGINT cancels the live runs, lets them wind down within
--shutdown-grace and exits; a second signal exits at once, and the next
start recovers.
`

// daemonOptions are the parsed flags of `taskrun daemon`.
type daemonOptions struct {
	executorFlags
	allows      []string
	egressFile  string
	credentials []string
	egress      egress.Operator
	maxima      runlimits.Maxima
	warm        int
	warmBudget  string
	budget      int64
	maxIdle     time.Duration
}

func init() {
	register(&command{
		Name:     "daemon",
		Synopsis: "serve runs to local clients from one resident executor",
		Help:     daemonHelp,
		Flags: func(fs *pflag.FlagSet) action {
			o := &daemonOptions{}
			o.define(fs)
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) > 0 {
					return a.usageError("daemon", fmt.Errorf("unexpected argument %q", args[0]))
				}
				if err := o.finish(); err != nil {
					return a.usageError("daemon", err)
				}
				if err := runDaemon(ctx, a, *o); err != nil {
					fmt.Fprintf(a.stderr, "taskrun daemon: %s\n", oneLine(err))
					return exitFailure
				}
				return exitOK
			}
		},
	})
}

func (o *daemonOptions) define(fs *pflag.FlagSet) {
	o.executorFlags.define(fs, flagRole{})
	// A pull uses the daemon's registry credentials: clients' runs use only
	// local images unless the operator says otherwise.
	o.pullSpec = string(sandbox.PullNever)
	pull := fs.Lookup("pull")
	pull.DefValue = o.pullSpec
	pull.Usage = "pull a client's run image from its registry: missing, always or never (the default: only local images; a pull uses this daemon's registry credentials, so any local user could pull what they give access to)"
	fs.StringArrayVar(&o.allows, "allow", nil, "let clients' runs ask to reach HOST[:PORT] through their egress proxy (no port: 80 and 443; *.suffix for every name below suffix); repeatable; none: runs have no network")
	fs.StringVar(&o.egressFile, "egress-policy", "", "JSON egress policy file: the rules and budgets clients' runs may ask for within (see docs/egress.md); its credentials go in --credential")
	fs.StringArrayVar(&o.credentials, "credential", nil, `header the egress proxy adds for one host, for the tenants named, who ask for it by id: id=ID,tenants="USER ...",host=H,header=N,value-env=VAR|value-file=PATH[,format="Bearer %s"] (tenants=* for all); repeatable`)
	addRunMaximaFlags(fs, &o.maxima)
	fs.IntVar(&o.warm, "warm", 0, "warm containers kept ready for runs of the default --image, --runtime and policy (each holds a run's --memory until a run claims it); 0: every run starts cold; with --warm-budget, the most kept")
	fs.DurationVar(&o.maxIdle, "max-idle", daemon.DefaultMaxIdle, "stop a live run (taskrun run --detach) after this long with no command or file call on it")
	fs.StringVar(&o.warmBudget, "warm-budget", "", "size the warm pool from recent demand within this much memory (e.g. 4g): every image, runtime and policy clients ran in the last minute keeps as many containers as it had runs then, at least one, up to --warm in all, their --memory limits within the budget; empty: --warm containers of the default run")
}

func (o *daemonOptions) finish() error {
	if err := o.executorFlags.finish(flagRole{}); err != nil {
		return err
	}
	if err := checkRunMaxima(o.maxima); err != nil {
		return err
	}
	switch {
	case o.maxIdle <= 0:
		return fmt.Errorf("--max-idle %s: give a positive duration", o.maxIdle)
	case o.warm < 0:
		return fmt.Errorf("--warm %d: give 0 (no warm containers) or more", o.warm)
	case o.warm > 0 && o.backend != backendDocker:
		return errors.New("--warm parks containers on this host's engine: it needs --backend docker")
	case o.warm > 0 && o.helpersDir == "":
		return errors.New("--warm needs the self-check, where a warm container waits: drop --helpers-dir \"\" or --warm")
	case o.warmBudget != "" && o.warm == 0:
		return errors.New("--warm-budget sizes the warm pool of --warm N: give --warm too (the most containers kept)")
	}
	if o.warmBudget != "" {
		n, err := units.RAMInBytes(o.warmBudget)
		if err != nil || n <= 0 {
			return fmt.Errorf("--warm-budget %q: give a size such as 4g", o.warmBudget)
		}
		o.budget = n
	}
	var err error
	o.egress, err = egress.BuildOperator(o.egressFile, o.allows, o.credentials)
	return err
}

// daemonModel resolves a client's model: the built-in demo script or the
// daemon's --model. A scripted:FILE would have the daemon read a path for
// the client, so it is refused.
func (o *daemonOptions) daemonModel(name string) (config.ModelEntry, error) {
	if provider, script, _ := strings.Cut(name, ":"); provider == config.ProviderScripted && script != "" && script != gateway.DemoScriptName && name != o.modelSpec {
		return config.ModelEntry{}, errors.New("scripted:FILE would have the daemon read a file for you: use scripted (the demo) or taskrun run --local")
	}
	return operatorModel(o.modelSpec, o.model, name)
}

// runDaemon serves until ctx ends.
func runDaemon(ctx context.Context, a *app, o daemonOptions) error {
	// A socket systemd passed (taskrun.socket) comes first; else the
	// daemon binds its own.
	l, err := daemon.ActivationListener()
	if err != nil {
		return err
	}
	var path string
	if l != nil {
		path = l.Addr().String()
	} else {
		path = daemon.SocketPath()
		if l, err = daemon.Listen(path); err != nil {
			return err
		}
	}
	defer l.Close()
	host, err := o.openHost(ctx, a, hostOptions{warm: o.warm})
	if err != nil {
		return err
	}
	defer host.close()
	if pool := host.WarmPool(); pool != nil && o.budget > 0 {
		if err := pool.SetMemoryBudget(o.budget); err != nil {
			return err
		}
	}
	// What an earlier daemon (or any gone executor of the root) left.
	host.Recover(ctx)
	srv, err := daemon.New(daemon.Config{Host: host.Host, Maxima: o.maxima, Egress: o.egress, Models: o.daemonModel,
		Records: host.store, StoreURL: journal.RedactURL(o.store), Logger: a.log, MaxIdle: o.maxIdle})
	if err != nil {
		return err
	}
	a.log.Info("taskrun daemon serving", "socket", path, "root", host.Layout().Root(), "executor", host.Executor().ID)
	return srv.Serve(ctx, l)
}
