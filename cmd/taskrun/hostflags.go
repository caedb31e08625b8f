package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/sandbox/kubernetes"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/workspace"
)

// executorFlags are the flags `run` and `worker` share, defined once: the
// host's machine (root, store, backend, helpers, uid range, attest key) and
// the defaults of its runs. They feed executor.Config.
type executorFlags struct {
	backendFlags
	attestKey     attestKeyFlag
	store, root   string
	image         string
	pullSpec      string
	pull          sandbox.PullPolicy
	allowedImages []string
	egressCA      string
	egressRoots   *x509.CertPool
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
}

// flagRole says whose flags executorFlags defines: `run` sets its run's
// values, `worker` the defaults of the runs it leases.
type flagRole struct {
	worker bool
}

// words returns the help text's prefix and suffix for a run's setting.
func (r flagRole) words() (pre, post string) {
	if r.worker {
		return "default ", " per run"
	}
	return "", ""
}

// define adds the shared flags to fs.
func (f *executorFlags) define(fs *pflag.FlagSet, r flagRole) {
	pre, post := r.words()
	f.policy = sandbox.DefaultPolicy()
	f.maxOutput, f.disk = executor.DefaultMaxOutputBytes, executor.DefaultDiskLimitBytes
	addStoreFlag(fs, &f.store)
	addRootFlag(fs, &f.root, defaultRoot)
	f.attestKey.define(fs)
	f.backendFlags.define(fs)
	pull, pullHelp := string(sandbox.DefaultPullPolicy), "pull the image from its registry: missing (when not present locally), always or never; credentials come from the docker config (DOCKER_CONFIG, ~/.docker/config.json) and its credential helpers"
	imageHelp := "run image: NAME[:TAG] or NAME@sha256:DIGEST (taskrun images build makes the default)"
	if r.worker {
		pull, pullHelp = string(sandbox.PullNever), "pull a run's image from its registry: missing, always or never (the default: only local images; anything else tells the control plane this worker may pull)"
		imageHelp = "default run image; it must exist locally"
	}
	fs.StringVar(&f.image, "image", executor.DefaultImage, imageHelp)
	fs.StringVar(&f.pullSpec, "pull", pull, pullHelp)
	fs.StringArrayVar(&f.allowedImages, "allowed-images", nil, "allow only images matching PATTERN (NAME, NAME:TAG or NAME@sha256:HEX, * globs; see README); any other is refused before it is pulled; repeatable")
	fs.StringVar(&f.egressCA, "egress-ca", "", "PEM bundle of CAs the egress proxy also trusts, besides the host's system roots, when it connects to a host it brokers a credential for or inspects (one served under a private CA)")
	fs.DurationVar(&f.timeout, "timeout", executor.DefaultTimeout, pre+"run time limit: the run is stopped after this long")
	addSizeFlag(fs, &f.policy.MemoryBytes, "memory", pre+"memory limit"+post+", e.g. 512m or 2g (no swap)")
	fs.Float64Var(&f.cpus, "cpus", float64(f.policy.NanoCPUs)/1e9, pre+"CPU limit"+post)
	fs.Int64Var(&f.policy.PidsLimit, "pids", f.policy.PidsLimit, pre+"process limit"+post)
	addSizeFlag(fs, &f.maxOutput, "max-output", pre+"cap on the stdout (and the stderr) kept from a run; the rest is dropped")
	addSizeFlag(fs, &f.disk, "disk", pre+"cap on what a run may store under /taskrun")
	fs.StringVar(&f.helpersDir, "helpers-dir", helpersSelf, `in-sandbox helpers: "self" (the static taskrun-probe and taskrun-relay of the same build beside this taskrun binary, as make build installs them, else this binary itself, which must be static), a directory of static taskrun-probe and taskrun-relay, or "" for no self-check`)
	fs.StringVar(&f.uidRange, "uid-range", uidpool.DefaultRange().String(), `host uids for runs, FIRST-LAST: each live run gets one of its own; "" runs every run as uid 10001`)
	fs.StringVar(&f.policy.Runtime, "runtime", "", pre+"OCI runtime, e.g. runsc for gVisor")
	fs.StringArrayVar(&f.excludes, "session-exclude", nil, "glob pattern (relative to home) left out of the session state; repeatable (default: "+strings.Join(workspace.DefaultExcludes, ", ")+")")
	if r.worker {
		fs.StringVar(&f.modelSpec, "model", "", "model runs may ask for besides scripted: openai:NAME or anthropic:NAME, with the --model-* flags")
	} else {
		fs.StringVar(&f.modelSpec, "model", "", "model for the agent: scripted (the built-in demo script), scripted:FILE, openai:NAME or anthropic:NAME; empty runs the agent offline")
	}
	fs.StringVar(&f.model.BaseURL, "model-base-url", "", "upstream API root of --model, e.g. https://api.openai.com/v1 (required for openai:NAME; anthropic:NAME defaults to "+gateway.DefaultAnthropicBaseURL+")")
	fs.StringVar(&f.model.APIKeyEnv, "model-api-key-env", "", "host environment variable holding --model's API key (it never enters the sandbox)")
	fs.StringVar(&f.model.APIKeyFile, "model-api-key-file", "", "host file holding --model's API key (it never enters the sandbox)")
	grace := "on SIGTERM or SIGINT, stop the container, store and report within this long; what is left waits in the journal for taskrun gc (a second signal exits at once)"
	if r.worker {
		grace = "once a run is cancelled, how long it may take to stop, store and report"
	}
	fs.DurationVar(&f.shutdownGrace, "shutdown-grace", defaultShutdownGrace, grace)
}

// finish checks the shared flags.
func (f *executorFlags) finish(r flagRole) error {
	if err := f.backendFlags.check(); err != nil {
		return err
	}
	if err := f.attestKey.load(); err != nil {
		return err
	}
	if !r.worker || f.modelSpec != "" {
		if err := parseModel(f.modelSpec, &f.model); err != nil {
			return err
		}
	}
	var err error
	if f.pull, err = sandbox.ParsePullPolicy(f.pullSpec); err != nil {
		return fmt.Errorf("--pull: %w", err)
	}
	if f.egressRoots, err = egress.LoadUpstreamRoots(f.egressCA); err != nil {
		return fmt.Errorf("--egress-ca: %w", err)
	}
	if f.cpus <= 0 {
		return fmt.Errorf("--cpus %v: give a positive number such as 1 or 0.5", f.cpus)
	}
	f.policy.NanoCPUs = int64(f.cpus * 1e9)
	if f.timeout <= 0 {
		return fmt.Errorf("--timeout %v: give a positive duration such as 10m", f.timeout)
	}
	if f.shutdownGrace <= 0 {
		return fmt.Errorf("--shutdown-grace %v: give a positive duration such as 30s", f.shutdownGrace)
	}
	if f.uidRange != "" {
		if f.uids, err = uidpool.ParseRange(f.uidRange); err != nil {
			return fmt.Errorf("--uid-range: %w", err)
		}
	}
	return nil
}

// hostOptions are what `run` and `worker` add to the flags when they open
// their host.
type hostOptions struct {
	// token is the control plane token recovery falls back to.
	token string
	// controlPlane is journaled with every run.
	controlPlane *journal.ControlPlane
	// dockerOpts are added to the Docker backend's options.
	dockerOpts []docker.Option
	// command is the default command (the agent's, on Kubernetes).
	command []string
	// warm asks for a warm pool keeping this many containers.
	warm int
	// shutdownGrace replaces the flag's value in the host when set.
	shutdownGrace time.Duration
}

// openedHost is a host opened from the flags, with what the command must
// release once it is done.
type openedHost struct {
	*executor.Host
	// store is the host's store, also the shared store a worker's
	// workspaces come from.
	store   *persist.Store
	closers []func()
}

// close releases the host and what it was built on, in reverse order.
func (o *openedHost) close() {
	for i := len(o.closers) - 1; i >= 0; i-- {
		o.closers[i]()
	}
}

// openHost builds the host the flags describe: the runs root and its
// executor instance, the helpers, the uid pool, the store and the backend.
// The one composition root of `run` and `worker`.
func (f *executorFlags) openHost(ctx context.Context, a *app, ho hostOptions) (_ *openedHost, err error) {
	o := &openedHost{}
	defer func() {
		if err != nil {
			o.close()
		}
	}()
	layout, err := executor.NewLayout(f.root)
	if err != nil {
		return nil, fmt.Errorf("--root: %w", err)
	}
	if err := layout.Create(); err != nil {
		return nil, fmt.Errorf("--root: %w", err)
	}
	cfg := executor.Config{
		Root: layout.Root(), StoreURL: f.store, AttestKey: f.attestKey.signer, Version: version,
		Defaults: executor.Defaults{
			Image: f.image, Command: ho.command, Policy: f.policy, Timeout: f.timeout,
			MaxOutputBytes: f.maxOutput, DiskLimitBytes: f.disk, SessionExcludes: f.excludes,
		},
		Pull: f.pull, AllowedImages: f.allowedImages, EgressRoots: f.egressRoots,
		ShutdownGrace: cmp(ho.shutdownGrace, f.shutdownGrace),
		ControlPlane:  ho.controlPlane, Token: ho.token, Logger: a.log,
	}
	switch f.helpersDir {
	case "":
	case helpersSelf:
		if cfg.Helpers, err = helpers.FromExecutable(layout.HelpersDir()); err != nil {
			return nil, fmt.Errorf("--helpers-dir %s: %w", helpersSelf, err)
		}
	default:
		if cfg.HelpersDir, err = filepath.Abs(f.helpersDir); err != nil {
			return nil, fmt.Errorf("--helpers-dir: %w", err)
		}
	}
	if f.uidRange != "" {
		if cfg.UIDs, err = uidpool.New(layout.UIDLeaseDir(), f.uids); err != nil {
			return nil, fmt.Errorf("--uid-range: %w", err)
		}
	}
	store, err := persist.Open(ctx, f.store)
	if err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	o.closers = append(o.closers, func() { store.Close() })
	cfg.Store, o.store = store, store
	inst, err := layout.StartInstance()
	if err != nil {
		return nil, err
	}
	o.closers = append(o.closers, func() { inst.Close() })
	cfg.Executor = inst.Info()
	if cfg.Backend, cfg.Reaper, err = f.openBackend(ctx, a, inst, ho.dockerOpts, o); err != nil {
		return nil, err
	}
	if ho.warm > 0 {
		cfg.Warm = &executor.Warm{PerKey: ho.warm, MaxSlots: ho.warm}
	}
	if o.Host, err = executor.New(ctx, cfg); err != nil {
		if ho.warm > 0 && errors.Is(err, executor.ErrConfig) {
			return nil, fmt.Errorf("--warm: %w", err)
		}
		return nil, err
	}
	o.closers = append(o.closers, func() { _ = o.Host.Close(context.WithoutCancel(ctx)) })
	return o, nil
}

// openBackend connects the backend the flags choose, for instance inst.
func (f *executorFlags) openBackend(ctx context.Context, a *app, inst *instance.Instance, extra []docker.Option, o *openedHost) (sandbox.Backend, executor.Reaper, error) {
	if f.backend == backendKubernetes {
		kb, err := f.kubernetesBackend(ctx, a.log, inst.ID(), kubernetes.WithInstanceProcess(inst.Info().Process()))
		if err != nil {
			return nil, nil, err
		}
		return kb, kubeReaper{b: kb, log: a.log}, nil
	}
	opts := append([]docker.Option{docker.WithLogger(a.log), docker.WithInstance(inst.ID()), docker.WithInstanceProcess(inst.Info().Process())}, extra...)
	d, err := docker.New(ctx, opts...)
	if err != nil {
		return nil, nil, err
	}
	o.closers = append(o.closers, func() { d.Close() })
	return d, nil, nil
}

// kubeReaper removes the Pods of this namespace whose executor is gone, as
// the start of every Docker run reaps containers.
type kubeReaper struct {
	b   *kubernetes.Backend
	log *slog.Logger
}

// ReapGone implements executor.Reaper.
func (k kubeReaper) ReapGone(ctx context.Context, gone func(id, process string) (bool, string)) error {
	rep, err := k.b.Reap(ctx, kubernetes.ReapOptions{ExecutorGone: gone})
	if err == nil && len(rep.Removed) > 0 {
		k.log.Info("removed leftover pods", "count", len(rep.Removed))
	}
	return err
}

// cmp is v, or def when v is zero.
func cmp[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
