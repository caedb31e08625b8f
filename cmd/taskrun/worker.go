package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/warmpool"
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
	server, tokenFile, token string
	tokenFromEnv             bool
	store, root              string
	slots                    int
	labels                   []string
	runtimes, images         []string
	pullSpec                 string
	pull                     sandbox.PullPolicy
	allowedImages            []string
	drainGrace               time.Duration
	metricsListen            string
	attestKey                attestKeyFlag
	leaseWait                time.Duration
	memory                   int64
	warm                     int

	image         string
	timeout       time.Duration
	disk          int64
	maxOutput     int64
	cpus          float64
	helpersDir    string
	uidRange      string
	uids          uidpool.Range
	policy        sandbox.Policy
	excludes      []string
	modelSpec     string
	model         config.ModelEntry
	shutdownGrace time.Duration

	// The operator's egress configuration and maxima: what a submitted
	// run's request is checked against.
	egressFile  string
	allows      []string
	credentials []string
	egress      egress.Operator
	maxima      runlimits.Maxima

	backendFlags
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
	o.policy = sandbox.DefaultPolicy()
	fs.StringVar(&o.server, "server", "", serverUsage)
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the worker token (default $"+workerTokenEnv+")")
	addStoreFlag(fs, &o.store)
	addRootFlag(fs, &o.root, defaultRoot)
	o.attestKey.define(fs)
	fs.IntVar(&o.slots, "slots", 1, "runs executed at once")
	fs.StringSliceVar(&o.labels, "labels", nil, "what this worker offers, as KEY=VALUE: runtime=NAME and image=REF (repeatable, comma-separated); default: the --runtime (runc) and the --image")
	fs.StringVar(&o.pullSpec, "pull", string(sandbox.PullNever), "pull a run's image from its registry: missing, always or never (the default: only local images; anything else tells the control plane this worker may pull)")
	fs.StringArrayVar(&o.allowedImages, "allowed-images", nil, "allow only images matching PATTERN (NAME, NAME:TAG or NAME@sha256:HEX, * globs; see README); any other run is refused before its image is pulled; repeatable")
	fs.DurationVar(&o.drainGrace, "drain-grace", worker.DefaultDrainGrace, "on SIGTERM, how long live runs may go on before they are cancelled")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "address for /metrics, /healthz and /readyz, e.g. 127.0.0.1:9464 (default: none)")
	fs.DurationVar(&o.leaseWait, "lease-wait", worker.DefaultLeaseWait, "how long the control plane may hold one lease request (at most 30s)")
	fs.IntVar(&o.warm, "warm", 0, "warm containers kept ready for runs of the default --image, --runtime and policy (each holds a run's --memory until a run claims it); 0: every run starts cold")
	addSizeFlag(fs, &o.memory, "host-memory", "memory the worker may grant runs in all (default: the host's)")

	fs.StringVar(&o.image, "image", taskrun.DefaultImage, "default run image; it must exist locally")
	fs.DurationVar(&o.timeout, "timeout", taskrun.DefaultTimeout, "default run time limit")
	o.maxOutput, o.disk = taskrun.DefaultMaxOutputBytes, taskrun.DefaultDiskLimitBytes
	addSizeFlag(fs, &o.policy.MemoryBytes, "memory", "default memory limit per run, e.g. 512m or 2g (no swap)")
	fs.Float64Var(&o.cpus, "cpus", float64(o.policy.NanoCPUs)/1e9, "default CPU limit per run")
	fs.Int64Var(&o.policy.PidsLimit, "pids", o.policy.PidsLimit, "default process limit per run")
	addSizeFlag(fs, &o.maxOutput, "max-output", "default cap on the stdout (and the stderr) kept from a run")
	addSizeFlag(fs, &o.disk, "disk", "default cap on what a run may store under /taskrun")
	fs.StringVar(&o.helpersDir, "helpers-dir", helpersSelf, `in-sandbox helpers: "self" (the static taskrun-probe and taskrun-relay of the same build beside this taskrun binary, as make build installs them, else this binary itself, which must be static), a directory of static taskrun-probe and taskrun-relay, or "" for no self-check`)
	fs.StringVar(&o.uidRange, "uid-range", uidpool.DefaultRange().String(), `host uids for runs, FIRST-LAST: each live run gets one of its own; "" runs every run as uid 10001`)
	fs.StringVar(&o.policy.Runtime, "runtime", "", "default OCI runtime, e.g. runsc for gVisor")
	fs.StringArrayVar(&o.excludes, "session-exclude", nil, "glob pattern (relative to home) left out of the session state; repeatable")
	fs.StringVar(&o.modelSpec, "model", "", "model runs may ask for besides scripted: openai:NAME or anthropic:NAME, with the --model-* flags")
	fs.StringVar(&o.model.BaseURL, "model-base-url", "", "upstream API root of --model")
	fs.StringVar(&o.model.APIKeyEnv, "model-api-key-env", "", "host environment variable holding --model's API key (it never enters the sandbox)")
	fs.StringVar(&o.model.APIKeyFile, "model-api-key-file", "", "host file holding --model's API key (it never enters the sandbox)")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", defaultShutdownGrace, "once a run is cancelled, how long it may take to stop, store and report")
	fs.StringArrayVar(&o.allows, "allow", nil, "let submitted runs ask to reach HOST[:PORT] through their egress proxy (no port: 80 and 443; *.suffix for every name below suffix); repeatable; none: runs have no network")
	fs.StringVar(&o.egressFile, "egress-policy", "", "JSON egress policy file: the rules and budgets submitted runs may ask for within (see docs/egress.md); its credentials go in --credential")
	fs.StringArrayVar(&o.credentials, "credential", nil, `header the egress proxy adds for one host, for the tenants named, who ask for it by id: id=ID,tenants="USER ...",host=H,header=N,value-env=VAR|value-file=PATH[,format="Bearer %s"] (tenants=* for all); repeatable`)
	addRunMaximaFlags(fs, &o.maxima)
	o.backendFlags.define(fs)
}

func (o *workerOptions) finish() error {
	if o.server == "" {
		return errors.New("--server is required: the control plane's base URL, e.g. http://127.0.0.1:8080")
	}
	if err := o.attestKey.load(); err != nil {
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
	if err := o.backendFlags.check(); err != nil {
		return err
	}
	if o.warm > 0 && o.backend != backendDocker {
		return errors.New("--warm parks containers on this host's engine: it needs --backend docker")
	}
	if o.warm > 0 && o.helpersDir == "" {
		return errors.New("--warm needs the self-check, where a warm container waits: drop --helpers-dir \"\" or --warm")
	}
	if o.cpus <= 0 {
		return fmt.Errorf("--cpus %v: give a positive number such as 1 or 0.5", o.cpus)
	}
	o.policy.NanoCPUs = int64(o.cpus * 1e9)
	if err := checkRunMaxima(o.maxima); err != nil {
		return err
	}
	var err error
	if o.egress, err = egress.BuildOperator(o.egressFile, o.allows, o.credentials); err != nil {
		return err
	}
	if o.pull, err = sandbox.ParsePullPolicy(o.pullSpec); err != nil {
		return fmt.Errorf("--pull: %w", err)
	}
	if o.timeout <= 0 || o.drainGrace <= 0 || o.shutdownGrace <= 0 {
		return errors.New("--timeout, --drain-grace and --shutdown-grace must be positive durations such as 30s")
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
	if o.modelSpec != "" {
		if err := parseModel(o.modelSpec, &o.model); err != nil {
			return err
		}
	}
	if o.uidRange != "" {
		r, err := uidpool.ParseRange(o.uidRange)
		if err != nil {
			return fmt.Errorf("--uid-range: %w", err)
		}
		o.uids = r
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
	if name == o.modelSpec && o.modelSpec != "" {
		return o.model, nil
	}
	var m config.ModelEntry
	provider, _, _ := strings.Cut(name, ":")
	if provider != config.ProviderScripted {
		return m, fmt.Errorf("this worker serves scripted models and --model %q only", o.modelSpec)
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
	root, err := filepath.Abs(o.root)
	if err != nil {
		return exitUsage, fmt.Errorf("--root: %w", err)
	}
	var helperFiles helpers.Files
	var helpersDir string
	switch o.helpersDir {
	case "":
	case helpersSelf:
		if helperFiles, err = helpers.FromExecutable(filepath.Join(root, "helpers")); err != nil {
			return exitCannotRun, fmt.Errorf("--helpers-dir %s: %w", helpersSelf, err)
		}
	default:
		if helpersDir, err = filepath.Abs(o.helpersDir); err != nil {
			return exitUsage, fmt.Errorf("--helpers-dir: %w", err)
		}
	}
	var uids *uidpool.Pool
	if o.uidRange != "" {
		if uids, err = uidpool.New(uidLeaseDir(root), o.uids); err != nil {
			return exitCannotRun, fmt.Errorf("--uid-range: %w", err)
		}
	}
	store, err := persist.Open(ctx, o.store)
	if err != nil {
		return exitCannotRun, fmt.Errorf("--store: %w", err)
	}
	defer store.Close()
	host, err := openHostState(root, o.token, log)
	if err != nil {
		return exitCannotRun, err
	}
	host.attestKey = o.attestKey.signer
	inst, err := instance.Start(host.executorsDir())
	if err != nil {
		return exitCannotRun, err
	}
	defer inst.Close()
	var runBackend sandbox.Backend
	var recoverHost func(context.Context)
	var pool *warmpool.Pool
	var command []string
	if o.backend == backendKubernetes {
		kb, err := o.kubernetesBackend(ctx, log, inst.ID())
		if err != nil {
			return exitCannotRun, err
		}
		runBackend = kb
		recoverHost = func(ctx context.Context) { reapKubernetes(ctx, host, kb, log) }
		if o.image == taskrun.DefaultImage {
			// A cluster's images cannot be inspected from here: name the
			// reference agent's command (its image's CMD) explicitly.
			command = []string{agentCommand}
		}
	} else {
		backend, err := docker.New(ctx, docker.WithLogger(log), docker.WithInstance(inst.ID()), docker.WithInstanceProcess(inst.Info().Process()))
		if err != nil {
			return exitCannotRun, err
		}
		defer backend.Close()
		runBackend = backend
		recoverHost = func(ctx context.Context) { collectGarbage(ctx, host, backend, log) }
		if o.warm > 0 {
			// The worker closes it once its runs drained.
			if pool, err = warmpool.New(warmpool.Config{Backend: backend, Dir: taskrun.PoolDir(root), DiskCapTemplates: taskrun.DiskCapTemplatesDir(root), Instance: inst.ID(),
				UIDs: uids, PerKey: o.warm, MaxSlots: o.warm, Logger: log}); err != nil {
				return exitCannotRun, fmt.Errorf("--warm: %w", err)
			}
		}
	}

	hostname, _ := os.Hostname()
	cp := &journal.ControlPlane{URL: journal.RedactURL(o.server)}
	if o.tokenFromEnv {
		cp.TokenEnv = workerTokenEnv
	} else if cp.TokenFile, err = filepath.Abs(o.tokenFile); err != nil {
		return exitUsage, fmt.Errorf("--token-file: %w", err)
	}
	cfg := worker.Config{
		Client:   workerclient.New(o.server, o.token, workerclient.WithLogger(log)),
		WorkerID: cmpOr(hostname, "host") + "/" + inst.ID(),
		Slots:    o.slots,
		Root:     root,
		Template: taskrun.RunTaskInput{
			Paths:           taskrun.NewRuntimePathsFromRoot(root),
			Persist:         store,
			ArtifactStorage: store,
			Sandbox:         runBackend,
			Image:           o.image,
			Command:         command,
			Policy:          o.policy,
			Timeout:         o.timeout,
			DiskLimitBytes:  o.disk,
			MaxOutputBytes:  o.maxOutput,
			SessionExcludes: o.excludes,
			Helpers:         helperFiles,
			HelpersDir:      helpersDir,
			UIDs:            uids,
			Logger:          log,
			Executor:        inst.Info(),
			AttestKey:       o.attestKey.signer,
			Version:         version,
			StoreURL:        o.store,
			ControlPlane:    cp,
			ShutdownGrace:   o.shutdownGrace,
			Pull:            o.pull,
			AllowedImages:   o.allowedImages,
		},
		Labels:      workerclient.WorkerLabels{Runtimes: o.runtimes, CanPull: o.pull != sandbox.PullNever, Backend: o.backend},
		Images:      o.images,
		MemoryBytes: o.memory,
		Workspaces:  store,
		Models:      o.models,
		Egress:      o.egress,
		RunMaxima:   o.maxima,
		LeaseWait:   o.leaseWait,
		DrainGrace:  o.drainGrace,
		Recover: func(ctx context.Context) error {
			recoverHost(ctx)
			return nil
		},
		RetryKept: func(ctx context.Context) int {
			still, err := host.retryKept(ctx, io.Discard)
			if err != nil {
				log.Warn("retry kept runs", "still_kept", still, "err", err)
			}
			return still
		},
		WarmPool: pool,
		Logger:   log,
	}
	w, err := worker.New(cfg)
	if err != nil {
		if pool != nil {
			_ = pool.Close(context.WithoutCancel(ctx))
		}
		return exitUsage, err
	}
	if o.metricsListen != "" {
		l, err := net.Listen("tcp", o.metricsListen)
		if err != nil {
			if pool != nil {
				_ = pool.Close(context.WithoutCancel(ctx))
			}
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
