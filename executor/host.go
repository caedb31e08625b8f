package executor

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/fencedstore"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/warmpool"
)

// ErrConfig is wrapped by every error New returns about its Config.
var ErrConfig = errors.New("executor: bad host configuration")

// Store keeps the runs' files and artifacts (persist.Store is one).
type Store interface {
	persist.PersistStorage
	persist.ArtifactStorage
}

// Defaults are what a Spec gets for each field it leaves zero.
type Defaults struct {
	// Image is the run image; DefaultImage when empty.
	Image string
	// Command is the command of a run that names neither a command nor an
	// entrypoint (the image's own when empty).
	Command []string
	// Policy confines the container; sandbox.DefaultPolicy() when its
	// MemoryBytes is zero.
	Policy sandbox.Policy
	// Timeout bounds a run's container; DefaultTimeout when zero.
	Timeout time.Duration
	// MaxOutputBytes caps the stdout and the stderr kept from a run, each
	// (negative: no cap); DiskLimitBytes caps what a run may store under
	// /taskrun (negative: no cap). Zero: DefaultMaxOutputBytes and
	// DefaultDiskLimitBytes.
	MaxOutputBytes int64
	DiskLimitBytes int64
	// SessionExcludes are the glob patterns (relative to home) left out
	// of a run's session state; workspace.DefaultExcludes when nil.
	SessionExcludes []string
}

// Warm asks New for a warm pool (package warmpool) on the host's backend,
// leasing from its uid pool, under its layout's pool directory.
type Warm struct {
	// PerKey is how many ready slots each key keeps, MaxSlots caps them
	// all, FillConcurrency caps the slots filled at once (warmpool.Config;
	// zero: its defaults).
	PerKey, MaxSlots, FillConcurrency int
}

// Config is one executor process's machine: what every run on the host
// shares. New checks it once.
type Config struct {
	// Root is the runs root (see Layout). Required: it holds the journal,
	// so no run on the host goes unjournaled.
	Root string
	// Paths, when set, places the run directories in place of the
	// layout's (workspace.Paths under Root, Layout.Paths). The journal,
	// the warm pool and the disk admission stay under Root.
	Paths RuntimePaths
	// Journal records the runs for crash recovery (package journal);
	// Layout.OpenJournal when nil. A run ID with a record is refused.
	Journal *journal.Dir
	// Backend runs the containers. A host without one only recovers and
	// retries (taskrun gc, persist); Run refuses.
	Backend sandbox.Backend
	// Store keeps the runs' files and the files the agents deliver (a
	// *persist.Store). Run refuses without it.
	Store Store
	// Artifacts, when set, keeps the files the agents deliver in place of
	// Store (the seed API's ArtifactStorage beside its PersistStorage).
	Artifacts persist.ArtifactStorage
	// StoreURL is Store's URL, journaled (without credentials) so that
	// recovery (`taskrun gc`) can reopen it if the executor dies.
	StoreURL string
	// Executor identifies this process in the journal
	// (Layout.StartInstance); required with Warm.
	Executor instance.Info
	// UIDs, when set, leases each run a host uid/gid of its own: the
	// container runs as it (replacing Policy.User), the run directory is
	// owned by it, and it is released once the container is gone. Runs then
	// never share per-user kernel limits (inotify instances, processes).
	// Without it every run is Policy.User.
	UIDs *uidpool.Pool
	// WarmPool, when set, is a warm pool the caller started and keeps
	// (Close leaves it running): it must park on Backend and lease from
	// UIDs. Set at most one of Warm and WarmPool. A run starts in a
	// container the pool parked ahead of time when one of the run's key
	// (its image, policy, helpers, disk cap, timeout and labels) is ready;
	// else it goes the cold path and the pool starts keeping containers of
	// that key. A warm run is confined, checked and recorded exactly as a
	// cold one; its run directory is the slot's, under the pool's
	// directory. A run without the self-check always goes cold.
	WarmPool *warmpool.Pool
	// Warm, when set, makes the host a warm pool (see Host.WarmPool); it
	// needs a backend that parks containers, the self-check (Helpers or
	// HelpersDir) and Executor.
	Warm *Warm
	// Helpers or HelpersDir (at most one) are the in-sandbox helpers:
	// Helpers the files of package helpers (such as helpers.FromExecutable:
	// those installed with the taskrun binary, or the binary itself, which
	// acts as the self-check and the relay), HelpersDir a directory of
	// separately built static helpers (taskrun-probe, required, and
	// taskrun-relay). With either every run starts with the in-sandbox
	// self-check, and a contradiction with the run's policy refuses the
	// run; exactly the helper files are mounted, read-only, file by file
	// under /.taskrun/bin. With neither a run has no self-check.
	Helpers    helpers.Files
	HelpersDir string
	// Defaults fill a Spec's zero fields.
	Defaults Defaults
	// Pull says when a run's image is pulled from its registry:
	// sandbox.PullMissing (the default, when empty) only when it does not
	// exist locally, PullAlways before every run, PullNever never. The
	// backend authenticates with the docker CLI's config and credential
	// helpers.
	Pull sandbox.PullPolicy
	// AllowedImages, when non-empty, is the only images a run may use
	// (package imageref: NAME, NAME:TAG, NAME@sha256:HEX, with * globs;
	// references normalized as docker does). Any other image is refused
	// before anything is pulled or created, with an error wrapping
	// ErrImageNotAllowed.
	AllowedImages []string
	// EgressRoots verifies the upstream TLS servers of the hosts a run's
	// egress proxy intercepts (brokered credentials, method or path
	// rules); nil uses the host's system roots. egress.LoadUpstreamRoots
	// adds an operator's CA bundle for hosts under a private CA.
	EgressRoots *x509.CertPool
	// PersistTimeout bounds storing a run's outputs and ReportTimeout its
	// final report (zero: DefaultPersistTimeout, DefaultReportTimeout).
	// ShutdownGrace bounds, once a run's ctx is cancelled, everything the
	// run still does (stopping the container, storing, reporting); what is
	// left is in the journal for `taskrun gc`. Zero: the deadlines above
	// only.
	PersistTimeout time.Duration
	ReportTimeout  time.Duration
	ShutdownGrace  time.Duration
	// AttestKey signs the attestations of the runs and recovered runs
	// (package attest), stored as attest.ObjectName beside a run's other
	// objects. Without a key an attestation is stored unsigned, and says
	// so. The key stays in the executor: it never enters the sandbox, a log
	// or a record.
	AttestKey *attest.Signer
	// Version is the executor's version, recorded in attestations.
	Version string
	// ControlPlane is journaled with every run (without credentials), so
	// recovery can report to it; a run's lease adds its fence.
	ControlPlane *journal.ControlPlane
	// Reaper, on a backend that does not list its containers
	// (sandbox.Capabilities.ListsContainers), removes the sandboxes of gone
	// executors at Recover.
	Reaper Reaper
	// Token is the control plane token recovery uses for a journaled run
	// whose token was not journaled by variable or file name.
	Token string
	// Logger receives the executor's log; slog.Default() when nil.
	Logger *slog.Logger
}

// Host is one executor process's machine, built once by New and shared by
// every run: Run executes a Spec on it, Recover and RetryKept finish what
// earlier executors of the runs root left.
type Host struct {
	cfg    Config
	layout Layout
	pool   *warmpool.Pool
	// ownPool is whether New started pool (Config.Warm), so Close stops it.
	ownPool bool
	log     *slog.Logger
	// live are the runs whose container is live, for Pause.
	live *liveRuns

	journalOnce sync.Once
	journal     *journal.Dir
	journalErr  error
}

// New checks cfg and builds the host: it creates the runs root and, with
// cfg.Warm, starts the warm pool. The journal (cfg.Journal, else the
// layout's) is opened when first used, so a refused run writes nothing
// under the root. Close releases what New
// made; the backend, stores, uid pool and instance stay the caller's.
func New(ctx context.Context, cfg Config) (*Host, error) {
	cfg, layout, err := resolve(cfg)
	if err != nil {
		return nil, err
	}
	if err := layout.Create(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	h := &Host{cfg: cfg, layout: layout, log: cfg.Logger, pool: cfg.WarmPool, live: &liveRuns{}}
	if cfg.Warm != nil {
		h.ownPool = true
		h.pool, err = warmpool.New(warmpool.Config{
			Backend: cfg.Backend, Dir: layout.PoolDir(), DiskCapTemplates: layout.DiskCapTemplatesDir(),
			Instance: cfg.Executor.ID, UIDs: cfg.UIDs, PerKey: cfg.Warm.PerKey, MaxSlots: cfg.Warm.MaxSlots, FillConcurrency: cfg.Warm.FillConcurrency, Logger: cfg.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("%w: warm pool: %w", ErrConfig, err)
		}
	}
	_ = ctx
	return h, nil
}

// resolve checks cfg and fills its defaults, creating nothing.
func resolve(cfg Config) (Config, Layout, error) {
	if cfg.Root == "" {
		return cfg, Layout{}, fmt.Errorf("%w: Config.Root is required: the runs root holds the journal, pool and run directories (taskrun run's --root)", ErrConfig)
	}
	layout, err := NewLayout(cfg.Root)
	if err != nil {
		return cfg, Layout{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	cfg.Root = layout.Root()
	if len(cfg.Helpers) > 0 && cfg.HelpersDir != "" {
		return cfg, Layout{}, fmt.Errorf("%w: set at most one of Config.Helpers and Config.HelpersDir", ErrConfig)
	}
	if cfg.Defaults, err = resolveDefaults(cfg.Defaults); err != nil {
		return cfg, Layout{}, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Warm != nil && cfg.WarmPool != nil {
		return cfg, Layout{}, fmt.Errorf("%w: set at most one of Config.Warm (a pool New starts) and Config.WarmPool (a pool you started)", ErrConfig)
	}
	if cfg.Warm != nil {
		if err := checkWarm(cfg); err != nil {
			return cfg, Layout{}, err
		}
	}
	return cfg, layout, nil
}

// resolveDefaults fills d's zero fields with taskrun's defaults.
func resolveDefaults(d Defaults) (Defaults, error) {
	if d.Image == "" {
		d.Image = DefaultImage
	}
	if d.Policy.MemoryBytes == 0 {
		d.Policy = sandbox.DefaultPolicy()
	}
	if d.Timeout == 0 {
		d.Timeout = DefaultTimeout
	}
	if d.Timeout < 0 {
		return d, fmt.Errorf("%w: Defaults.Timeout %v: give a positive duration such as 30m", ErrConfig, d.Timeout)
	}
	return d, nil
}

// checkWarm refuses a warm pool that could never serve a run.
func checkWarm(cfg Config) error {
	switch {
	case cfg.Backend == nil:
		return fmt.Errorf("%w: a warm pool parks containers on the host's backend: set Config.Backend", ErrConfig)
	case len(cfg.Helpers) == 0 && cfg.HelpersDir == "":
		return fmt.Errorf("%w: a warm container waits at the self-check: set Config.Helpers or Config.HelpersDir, or drop Config.Warm", ErrConfig)
	case cfg.Executor.ID == "":
		return fmt.Errorf("%w: a warm pool's slots belong to the executor instance: set Config.Executor (Layout.StartInstance)", ErrConfig)
	case cfg.Warm.PerKey < 0 || cfg.Warm.MaxSlots < 0 || cfg.Warm.FillConcurrency < 0:
		return fmt.Errorf("%w: Warm %+v: give 0 (the default) or more", ErrConfig, *cfg.Warm)
	}
	if _, ok := cfg.Backend.(sandbox.Parker); !ok {
		return fmt.Errorf("%w: backend %T cannot park containers: a warm pool needs the Docker backend", ErrConfig, cfg.Backend)
	}
	return nil
}

// Close removes the parked containers of the warm pool New started
// (Config.Warm; a Config.WarmPool stays the caller's). The host is not used
// after.
func (h *Host) Close(ctx context.Context) error {
	if h.pool == nil || !h.ownPool {
		return nil
	}
	return h.pool.Close(ctx)
}

// Layout is the host's runs root.
func (h *Host) Layout() Layout { return h.layout }

// Journal is the runs' crash journal: Config.Journal, else the layout's,
// opened (and created) on first use. Every run on the host is journaled
// there.
func (h *Host) Journal() (*journal.Dir, error) {
	h.journalOnce.Do(func() {
		if h.journal = h.cfg.Journal; h.journal == nil {
			if h.journal, h.journalErr = h.layout.OpenJournal(); h.journalErr != nil {
				h.journalErr = fmt.Errorf("executor: journal under %s: %w", h.layout.Root(), h.journalErr)
			}
		}
	})
	return h.journal, h.journalErr
}

// Backend runs the containers; nil on a host that only recovers.
func (h *Host) Backend() sandbox.Backend { return h.cfg.Backend }

// Store keeps the runs' files and artifacts; nil on a host that only
// recovers (each recovered run's store comes from its journal record).
func (h *Host) Store() Store { return h.cfg.Store }

// WarmPool is the host's warm pool (Config.WarmPool, or the one New
// started for Config.Warm), or nil.
func (h *Host) WarmPool() *warmpool.Pool { return h.pool }

// Defaults are the host's defaults, resolved.
func (h *Host) Defaults() Defaults { return h.cfg.Defaults }

// Executor identifies the executor process.
func (h *Host) Executor() instance.Info { return h.cfg.Executor }

// ShutdownGrace bounds a run's wind-down once it is cancelled.
func (h *Host) ShutdownGrace() time.Duration { return h.cfg.ShutdownGrace }

// Logger is the host's log.
func (h *Host) Logger() *slog.Logger { return h.cfg.Logger }

// Run executes one run on the host, end to end: it plans the run, claims
// a warm container when the pool has one ready, admits and journals it and
// hands it to the runner (see the package documentation). Its outcome is
// reported through spec.Updater -- a spec refused as invalid too, as
// FAILED, with an error wrapping ErrInvalidInput -- and the error is nil
// only for a run that SUCCEEDED (errors.Is ErrRunFailed otherwise). A host
// that cannot run (no Backend or Store) returns an ErrConfig error and
// reports nothing.
func (h *Host) Run(ctx context.Context, spec Spec) (*Outcome, error) {
	if err := h.canRun(); err != nil {
		return nil, err
	}
	return execute(ctx, h.runInput(spec))
}

// canRun refuses to run on a host built only to recover.
func (h *Host) canRun() error {
	switch {
	case h.cfg.Backend == nil:
		return fmt.Errorf("%w: this host has no backend to run on: set Config.Backend", ErrConfig)
	case h.cfg.Store == nil:
		return fmt.Errorf("%w: this host has no store for the runs' outputs: set Config.Store", ErrConfig)
	}
	return nil
}

// RetryPersist finishes the run spec names whose storing failed: it
// uploads the local copy the run kept (output logs, trace, artifacts,
// output files, session state, isolation record), removes it once
// everything is stored, and reports the run's final status again through
// spec.Updater, with the verdict the run reached before persisting. spec
// names the same run (same IDs and session); the original run's session
// excludes and KeepRunDir apply, and the host's Backend is unused. A
// journaled run is taken over from the journal (while a live process holds
// it the error wraps journal.ErrBusy); a run whose executor died before
// collecting is finished from its journal record, as FAILED.
func (h *Host) RetryPersist(ctx context.Context, spec Spec) (*Outcome, error) {
	if h.cfg.Store == nil {
		return nil, fmt.Errorf("%w: this host has no store to persist to: set Config.Store", ErrConfig)
	}
	return retryPersist(ctx, h.runInput(spec))
}

// WarmTemplate is the warm pool key of runs shaped like spec (its IDs,
// workspace, prompt, model and environment do not matter): give it to
// WarmPool().Warm or WaitReady to keep containers ready for such runs
// before the first one comes. It validates spec and, on a host with a
// Backend, resolves its image (Config.Pull applies) as Run does.
func (h *Host) WarmTemplate(ctx context.Context, spec Spec) (warmpool.Template, error) {
	return warmTemplate(ctx, h.runInput(spec))
}

// runInput is the pipeline's input for spec on this host: the spec's
// per-run fields, the host's machine and the defaults for what spec leaves
// zero.
func (h *Host) runInput(spec Spec) runInput {
	c, d := h.cfg, h.cfg.Defaults
	in := runInput{
		Task: spec.Task, Run: spec.Run, SessionID: spec.SessionID,
		Updater: spec.Updater, StreamSender: spec.StreamSender,
		Model: spec.Model, Egress: spec.Egress,
		Image: cmpOr(spec.Image, d.Image), Command: spec.Command, Entrypoint: spec.Entrypoint, Env: spec.Env,
		Policy:          d.Policy,
		Timeout:         cmpOr(spec.Timeout, d.Timeout),
		MaxOutputBytes:  cmpOr(spec.MaxOutputBytes, d.MaxOutputBytes),
		DiskLimitBytes:  cmpOr(spec.DiskLimitBytes, d.DiskLimitBytes),
		SessionExcludes: spec.SessionExcludes,
		ChangeExcludes:  spec.ChangeExcludes,
		KeepRunDir:      spec.KeepRunDir,
		Labels:          spec.Labels,
		Stdout:          spec.Stdout, Stderr: spec.Stderr, Timings: spec.Timings, OnUsage: spec.OnUsage,

		root: h.layout.Root(), Paths: h.paths(), Persist: c.Store, ArtifactStorage: c.Store,
		Sandbox: c.Backend, Pull: c.Pull, AllowedImages: c.AllowedImages, EgressRoots: c.EgressRoots,
		Helpers: c.Helpers, HelpersDir: c.HelpersDir, UIDs: c.UIDs, WarmPool: h.pool,
		// Without Config.Journal the pipeline opens the layout's journal
		// itself, under root, once the run is admitted.
		Logger: c.Logger, Journal: c.Journal, Executor: c.Executor,
		AttestKey: c.AttestKey, Version: c.Version, StoreURL: c.StoreURL, ControlPlane: c.ControlPlane,
		PersistTimeout: c.PersistTimeout, ReportTimeout: c.ReportTimeout, ShutdownGrace: c.ShutdownGrace,
		live: h.live,
	}
	if c.Artifacts != nil {
		in.ArtifactStorage = c.Artifacts
	}
	if spec.Policy != nil {
		in.Policy = *spec.Policy
	}
	if len(spec.Command) == 0 && len(spec.Entrypoint) == 0 {
		in.Command = d.Command
	}
	if spec.SessionExcludes == nil {
		in.SessionExcludes = d.SessionExcludes
	}
	if l := spec.Lease; l != nil {
		cp := journal.ControlPlane{}
		if c.ControlPlane != nil {
			cp = *c.ControlPlane
		}
		cp.Fence, cp.LeaseToken = l.Epoch, l.Token
		in.ControlPlane = &cp
		if l.Confirm != nil && in.Persist != nil {
			fenced := fencedstore.New(in.Persist, in.ArtifactStorage, l.Confirm, h.log.With("run", runID(spec), "epoch", l.Epoch))
			in.Persist, in.ArtifactStorage = fenced, fenced
		}
	}
	return in
}

// paths places the host's run directories: Config.Paths, else the
// layout's.
func (h *Host) paths() RuntimePaths {
	if h.cfg.Paths != nil {
		return h.cfg.Paths
	}
	return h.layout.Paths()
}

// cmpOr is v, or def when v is zero.
func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
