package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/worker"
	"github.com/taskrun/taskrun/workerclient"
)

// workerTokenEnv is the environment variable the worker token is read from
// when --token-file is not given.
const workerTokenEnv = "TASKRUN_WORKER_TOKEN"

const workerHelp = `
Runs this host's executor service: it leases runs from the control plane at
--server (a long poll, only while it has a free slot and room for a run:
disk under --root, memory, and the offered images present locally), executes
up to --slots of them at once in hardened containers exactly as taskrun run
does, renews each lease, and reports status and output with the lease's
fencing token. A run whose lease is lost is stopped at once and reported by
nobody here; a run its owner cancels reports CANCELLED.

Before leasing anything it recovers what an earlier executor on this host
left (as taskrun gc does), and it retries in the background the runs whose
storing failed.

SIGTERM or SIGINT drains: no new lease, live runs get --drain-grace to finish,
then they are cancelled (CANCELLED "run cancelled: worker shutting down"), and
the worker exits 0. A second signal exits at once; the next start recovers.

--warm N keeps N containers of the default --image, --runtime and policy
started ahead of the runs, parked at the self-check: a run that matches
takes one and its agent starts within milliseconds; any other run starts
cold. Each parked container counts its --memory against --host-memory. The
parked containers are removed when the worker stops.

--backend kubernetes runs each leased run as a Pod in --namespace of the
cluster --kubeconfig names, exactly as taskrun run --backend kubernetes does
(start-up recovery then reaps the Pods of gone executors); --warm needs the
Docker backend.

Everything a submission asks for is a tenant's request, checked against
this worker's flags (the operator's word): its limits are refused over the
--max-run-* maxima; its egress can only narrow --allow and --egress-policy
(none given: runs have no network), can never reach a loopback, private,
link-local or metadata address, and names a credential only by the id a
--credential gives it for that tenant. See "Trust boundary" in
docs/architecture.md.

--metrics-listen serves /metrics (Prometheus), /healthz and /readyz (ready
once recovery finished, until draining).
`

// workerOptions are the parsed flags of `taskrun worker`.
type workerOptions struct {
	executorFlags
	server, tokenFile, token string
	tokenFromEnv             bool
	slots                    int
	labels                   []string
	runtimes, images         []string
	drainGrace               time.Duration
	metricsListen            string
	leaseWait                time.Duration
	memory                   int64
	warm                     int
	liveListen, liveURL      string
	maxIdle                  time.Duration
	pauseOnIdle              bool

	// The operator's egress configuration and maxima: what a submitted
	// run's request is checked against.
	egressFile  string
	allows      []string
	credentials []string
	egress      egress.Operator
	maxima      runlimits.Maxima
}

func init() {
	register(&command{
		Name:     "worker",
		Synopsis: "lease runs from a control plane and execute them on this host",
		Help:     workerHelp,
		Flags: func(fs *pflag.FlagSet) action {
			o := &workerOptions{}
			o.define(fs)
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) > 0 {
					return a.usageError("worker", fmt.Errorf("unexpected argument %q", args[0]))
				}
				if err := o.finish(); err != nil {
					return a.usageError("worker", err)
				}
				return runWorker(ctx, a, *o)
			}
		},
	})
}

func (o *workerOptions) define(fs *pflag.FlagSet) {
	fs.StringVar(&o.server, "server", "", serverUsage)
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the worker token (default $"+workerTokenEnv+")")
	o.executorFlags.define(fs, flagRole{worker: true})
	fs.IntVar(&o.slots, "slots", 1, "runs executed at once")
	fs.StringSliceVar(&o.labels, "labels", nil, "what this worker offers, as KEY=VALUE: runtime=NAME and image=REF (repeatable, comma-separated); default: the --runtime (runc) and the --image")
	fs.DurationVar(&o.drainGrace, "drain-grace", worker.DefaultDrainGrace, "on SIGTERM, how long live runs may go on before they are cancelled")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "address for /metrics, /healthz and /readyz, e.g. 127.0.0.1:9464 (default: none)")
	fs.DurationVar(&o.leaseWait, "lease-wait", worker.DefaultLeaseWait, "how long the control plane may hold one lease request (at most 30s)")
	fs.IntVar(&o.warm, "warm", 0, "warm containers kept ready for runs of the default --image, --runtime and policy (each holds a run's --memory until a run claims it); 0: every run starts cold")
	addSizeFlag(fs, &o.memory, "host-memory", "memory the worker may grant runs in all (default: the host's)")
	fs.StringArrayVar(&o.allows, "allow", nil, "let submitted runs ask to reach HOST[:PORT] through their egress proxy (no port: 80 and 443; *.suffix for every name below suffix); repeatable; none: runs have no network")
	fs.StringVar(&o.egressFile, "egress-policy", "", "JSON egress policy file: the rules and budgets submitted runs may ask for within (see docs/egress.md); its credentials go in --credential")
	fs.StringArrayVar(&o.credentials, "credential", nil, `header the egress proxy adds for one host, for the tenants named, who ask for it by id: id=ID,tenants="USER ...",host=H,header=N,value-env=VAR|value-file=PATH[,format="Bearer %s"] (tenants=* for all); repeatable`)
	addRunMaximaFlags(fs, &o.maxima)
	fs.StringVar(&o.liveListen, "live-listen", "", "address serving the live API of keep-alive runs to the control plane, e.g. 127.0.0.1:9465 (default: none, keep-alive runs are refused)")
	fs.StringVar(&o.liveURL, "live-url", "", "the control plane's URL for --live-listen (default: http:// and its address)")
	fs.DurationVar(&o.maxIdle, "max-idle", daemon.DefaultMaxIdle, "stop a keep-alive run after this long with no call on its live API (a run may ask for less)")
	fs.BoolVar(&o.pauseOnIdle, "pause-on-idle", false, "pause an idle keep-alive run (reported PAUSED) instead of stopping it")
}

func (o *workerOptions) finish() error {
	if o.server == "" {
		return errors.New("--server is required: the control plane's base URL, e.g. http://127.0.0.1:8080")
	}
	if err := o.executorFlags.finish(flagRole{worker: true}); err != nil {
		return err
	}
	if o.tokenFile != "" {
		data, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		o.token = strings.TrimSpace(string(data))
	} else {
		o.token, o.tokenFromEnv = os.Getenv(workerTokenEnv), true
	}
	if o.token == "" {
		return fmt.Errorf("no worker token: pass --token-file or set $%s", workerTokenEnv)
	}
	if o.slots < 1 {
		return fmt.Errorf("--slots %d: give at least 1", o.slots)
	}
	if o.warm < 0 {
		return fmt.Errorf("--warm %d: give 0 (no warm containers) or more", o.warm)
	}
	if o.warm > 0 && o.backend != backendDocker {
		return errors.New("--warm parks containers on this host's engine: it needs --backend docker")
	}
	if o.warm > 0 && o.helpersDir == "" {
		return errors.New("--warm needs the self-check, where a warm container waits: drop --helpers-dir \"\" or --warm")
	}
	if err := checkRunMaxima(o.maxima); err != nil {
		return err
	}
	var err error
	if o.egress, err = egress.BuildOperator(o.egressFile, o.allows, o.credentials); err != nil {
		return err
	}
	if o.drainGrace <= 0 {
		return fmt.Errorf("--drain-grace %v: give a positive duration such as 5m", o.drainGrace)
	}
	for _, l := range o.labels {
		k, v, ok := strings.Cut(l, "=")
		switch {
		case ok && k == "runtime" && v != "":
			o.runtimes = append(o.runtimes, v)
		case ok && k == "image" && v != "":
			o.images = append(o.images, v)
		default:
			return fmt.Errorf("--labels %q: use runtime=NAME or image=REF", l)
		}
	}
	if len(o.runtimes) == 0 {
		o.runtimes = []string{cmpOr(o.policy.Runtime, "runc")}
	}
	if len(o.images) == 0 {
		o.images = []string{o.image}
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// models resolves an assignment's model name: scripted ones always, and the
// one --model configures.
func (o *workerOptions) models(name string) (config.ModelEntry, error) {
	return operatorModel(o.modelSpec, o.model, name)
}

// operatorModel resolves a tenant's model name on a shared host: scripted
// ones always, and the one the operator's --model (spec, configured as
// conf) names.
func operatorModel(spec string, conf config.ModelEntry, name string) (config.ModelEntry, error) {
	if name == spec && spec != "" {
		return conf, nil
	}
	var m config.ModelEntry
	provider, _, _ := strings.Cut(name, ":")
	if provider != config.ProviderScripted {
		return m, fmt.Errorf("this host serves scripted models and --model %q only", spec)
	}
	if err := parseModel(name, &m); err != nil {
		return m, err
	}
	if m.Name == "" {
		m.Name = gateway.DemoScriptName
	}
	return m, nil
}

// runWorker runs the worker until a signal, then drains.
func runWorker(ctx context.Context, a *app, o workerOptions) int {
	code, err := executeWorker(ctx, a, o)
	if err != nil {
		fmt.Fprintf(a.stderr, "taskrun worker: %s\n", oneLine(err))
	}
	return code
}

func executeWorker(ctx context.Context, a *app, o workerOptions) (int, error) {
	log := a.log
	cp := &journal.ControlPlane{URL: journal.RedactURL(o.server)}
	var err error
	if o.tokenFromEnv {
		cp.TokenEnv = workerTokenEnv
	} else if cp.TokenFile, err = filepath.Abs(o.tokenFile); err != nil {
		return exitUsage, fmt.Errorf("--token-file: %w", err)
	}
	ho := hostOptions{token: o.token, controlPlane: cp, warm: o.warm}
	if o.backend == backendKubernetes && o.image == executor.DefaultImage {
		// A cluster's images cannot be inspected from here: name the
		// reference agent's command (its image's CMD) explicitly.
		ho.command = []string{agentCommand}
	}
	host, err := o.openHost(ctx, a, ho)
	if err != nil {
		return exitCannotRun, err
	}
	defer host.close()

	hostname, _ := os.Hostname()
	cfg := worker.Config{
		Client:      workerclient.New(o.server, o.token, workerclient.WithLogger(log)),
		WorkerID:    cmpOr(hostname, "host") + "/" + host.Executor().ID,
		Slots:       o.slots,
		Host:        host.Host,
		Labels:      workerclient.WorkerLabels{Runtimes: o.runtimes, CanPull: o.pull != sandbox.PullNever, Backend: o.backend},
		Images:      o.images,
		MemoryBytes: o.memory,
		Workspaces:  host.store,
		Records:     host.store,
		Models:      o.models,
		Egress:      o.egress,
		RunMaxima:   o.maxima,
		LeaseWait:   o.leaseWait,
		DrainGrace:  o.drainGrace,
		Logger:      log,
	}
	if o.liveListen != "" {
		l, err := net.Listen("tcp", o.liveListen)
		if err != nil {
			return exitUsage, fmt.Errorf("--live-listen: %w", err)
		}
		live, err := daemon.New(daemon.Config{Host: host.Host, Maxima: o.maxima, MaxIdle: o.maxIdle, Logger: log})
		if err != nil {
			l.Close()
			return exitUsage, fmt.Errorf("--live-listen: %w", err)
		}
		secret, err := liveSecret()
		if err != nil {
			l.Close()
			return exitCannotRun, err
		}
		u := cmpOr(o.liveURL, "http://"+l.Addr().String())
		cfg.Live, cfg.LiveEndpoint, cfg.PauseOnIdle = live, &workerclient.LiveEndpoint{URL: u, Secret: secret}, o.pauseOnIdle
		// Commands' streams last as long as they run: no write timeout.
		srv := &http.Server{Handler: live.LiveHandler(secret), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		log.Info("serving the live API", "addr", l.Addr().String(), "url", u)
	}
	w, err := worker.New(cfg)
	if err != nil {
		return exitUsage, err
	}
	if o.metricsListen != "" {
		l, err := net.Listen("tcp", o.metricsListen)
		if err != nil {
			return exitUsage, fmt.Errorf("--metrics-listen: %w", err)
		}
		srv := &http.Server{Handler: w.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		log.Info("serving metrics", "addr", l.Addr().String())
	}
	if err := w.Run(ctx); err != nil {
		return exitFailure, err
	}
	return exitOK, nil
}

// liveSecret is a fresh secret the control plane sends to the worker's
// live API.
func liveSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("live API secret: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
