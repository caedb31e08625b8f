// Package runtest is the one end-to-end harness of taskrun's tests: the root
// package's, abuse/ and integration/ use it, and integration/taskruntest is
// built on it. An Env holds the real parts runs need -- a Docker backend, a
// blob store and a run root, made one executor.Host with executor.New -- for
// one tenant of its own. It runs a Spec on that host (Spec, Run), or builds
// the seed API's RunTaskInput of the same machine for tests of the root
// facade (Input, Execute), reads back what runs stored, and tells which of
// the tenant's containers are still there, so each test can prove it left
// none.
package runtest

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/warmpool"
)

// Defaults of Options.
const (
	DefaultConversationID = "conv1"
	DefaultTaskID         = "task1"
	DefaultSessionID      = "s1"
	DefaultTimeout        = 2 * time.Minute
)

// ErrBadOptions is wrapped by errors about Options themselves.
var ErrBadOptions = errors.New("runtest: bad options")

// Options configure an Env.
type Options struct {
	// Dir holds the run root and, without StoreURL, the store. It must be
	// an absolute path, e.g. t.TempDir().
	Dir string
	// StoreURL opens the blob store (persist.Open); file://Dir/store when empty.
	StoreURL string
	// Tenant is the user ID of every run; "t" and a random suffix when empty.
	Tenant string
	// ConversationID, TaskID and SessionID place the runs; the Default*
	// constants when empty.
	ConversationID, TaskID, SessionID string
	// Labels are put on every run's container next to the dev.taskrun.*
	// labels (e.g. a test framework's session labels).
	Labels map[string]string
	// Logger receives the backend's and the host's log; discarded when
	// nil. (A RunTaskInput from Input logs to its own Logger.)
	Logger *slog.Logger
	// Warm gives the Env a warm pool (Env.Pool): Input sets it, and Run and
	// Execute run each run in a container parked ahead of it. It needs
	// HelpersDir (New defaults it to testbin.Dir).
	Warm bool
	// HelpersDir, when set, gives every run the in-sandbox self-check with
	// the static helpers there (executor.Config.HelpersDir).
	HelpersDir string
	// Helpers, when set, are the in-sandbox helpers (executor.Config.Helpers).
	Helpers helpers.Files
	// UIDPerRun gives every run a host uid of its own from
	// uidpool.DefaultRange, leased under the run root, as `taskrun run`
	// does by default; without it every run is uid 10001.
	UIDPerRun bool
	// EgressRoots is executor.Config.EgressRoots.
	EgressRoots *x509.CertPool
}

// Env is a place for runs of one tenant. It is safe for concurrent runs.
type Env struct {
	// Backend runs the containers, Store keeps what runs persist, Root
	// holds the run directories.
	Backend *docker.Backend
	Store   *persist.Store
	Root    string
	// Tenant, ConversationID, TaskID and SessionID place every run.
	Tenant, ConversationID, TaskID, SessionID string
	// Labels are on every run's container.
	Labels map[string]string
	// Host is the executor host the runs execute on, built with
	// executor.New from Config.
	Host *executor.Host
	// Config is Host's configuration: a test that needs another machine
	// (another pull policy, image rules) builds its own host from a copy.
	Config executor.Config
	// Pool is the Env's warm pool with Options.Warm, else nil.
	Pool *warmpool.Pool
	// Instance is the executor instance ID the backend labels containers
	// with, with Options.Warm.
	Instance string
}

// Open opens an Env; Close releases it.
func Open(ctx context.Context, opts Options) (*Env, error) {
	if !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("%w: Dir %q must be an absolute path, e.g. t.TempDir()", ErrBadOptions, opts.Dir)
	}
	storeURL := opts.StoreURL
	if storeURL == "" {
		storeURL = "file://" + filepath.Join(opts.Dir, "store")
	}
	store, err := persist.Open(ctx, storeURL)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(opts.Dir, "runtime")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var inst string
	opts2 := []docker.Option{docker.WithLogger(log)}
	if opts.Warm {
		inst = instance.NewID()
		opts2 = append(opts2, docker.WithInstance(inst))
	}
	backend, err := docker.New(ctx, opts2...)
	if err != nil {
		_ = store.Close()
		return nil, err
	}
	cfg := executor.Config{
		Root: root, Backend: backend, Store: store, StoreURL: storeURL, Executor: instance.Info{ID: inst},
		HelpersDir: opts.HelpersDir, Helpers: opts.Helpers, EgressRoots: opts.EgressRoots,
		// Tests reach no registry unless they ask for a pull.
		Pull:     sandbox.PullNever,
		Defaults: executor.Defaults{Timeout: DefaultTimeout},
		Logger:   log,
	}
	if opts.Warm {
		cfg.Warm = &executor.Warm{PerKey: 1, MaxSlots: 2}
	}
	if opts.UIDPerRun {
		layout, err := executor.NewLayout(root)
		if err == nil {
			cfg.UIDs, err = uidpool.New(layout.UIDLeaseDir(), uidpool.DefaultRange())
		}
		if err != nil {
			_ = backend.Close()
			_ = store.Close()
			return nil, fmt.Errorf("runtest: a uid per run: %w", err)
		}
	}
	host, err := executor.New(ctx, cfg)
	if err != nil {
		_ = backend.Close()
		_ = store.Close()
		return nil, fmt.Errorf("runtest: %w", err)
	}
	return &Env{
		Host:           host,
		Config:         cfg,
		Pool:           host.WarmPool(),
		Instance:       inst,
		Backend:        backend,
		Store:          store,
		Root:           root,
		Tenant:         orDefault(opts.Tenant, "t"+RandomID()),
		ConversationID: orDefault(opts.ConversationID, DefaultConversationID),
		TaskID:         orDefault(opts.TaskID, DefaultTaskID),
		SessionID:      orDefault(opts.SessionID, DefaultSessionID),
		Labels:         maps.Clone(opts.Labels),
	}, nil
}

// New opens an Env for a test, which it skips in -short mode (runs need a
// container engine). At cleanup it fails the test if any container of the
// tenant is left, removes those, and closes the Env.
func New(tb testing.TB, opts Options) *Env {
	tb.Helper()
	if testing.Short() {
		tb.Skip("runs real containers")
	}
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	if opts.Warm && opts.HelpersDir == "" {
		opts.HelpersDir = testbin.Dir(tb)
	}
	e, err := Open(tb.Context(), opts)
	if err != nil {
		tb.Fatalf("runtest: %v", err)
	}
	tb.Cleanup(func() {
		ctx := context.Background()
		left, err := e.Containers(ctx)
		if err != nil {
			tb.Errorf("runtest: list containers: %v", err)
		}
		if len(left) > 0 {
			tb.Errorf("runtest: containers left behind for tenant %s: %v", e.Tenant, left)
		}
		if e.Pool != nil {
			if err := e.Pool.Close(ctx); err != nil {
				tb.Errorf("runtest: close the warm pool: %v", err)
			}
			parked, err := ListContainers(ctx, map[string]string{sandbox.LabelInstance: e.Instance})
			if err != nil || len(parked) > 0 {
				tb.Errorf("runtest: warm containers left behind: %v %v", parked, err)
			}
		}
		if err := errors.Join(e.RemoveContainers(ctx), e.Close()); err != nil {
			tb.Errorf("runtest: %v", err)
		}
	})
	return e
}

// Close releases the backend and the store; the directories are left to
// their owner.
func (e *Env) Close() error {
	return errors.Join(e.Host.Close(context.Background()), e.Backend.Close(), e.Store.Close())
}

// Run runs spec on the Env's host (Host.Run). With a warm pool it first
// waits until a container of spec's key is parked, and fails unless the
// run took it: a test meant for the warm path never passes on the cold one.
func (e *Env) Run(ctx context.Context, spec executor.Spec) (*executor.Outcome, error) {
	return e.warm(ctx, runID(spec.Run),
		func(ctx context.Context) (warmpool.Template, error) { return e.Host.WarmTemplate(ctx, spec) },
		func(ctx context.Context) (*executor.Outcome, error) { return e.Host.Run(ctx, spec) })
}

// Execute runs in through the root facade (taskrun.Execute: the host of
// in's machine, built with executor.New, and Host.Run), with Run's warm
// pool check.
func (e *Env) Execute(ctx context.Context, in taskrun.RunTaskInput) (*executor.Outcome, error) {
	return e.warm(ctx, runID(in.Run),
		func(ctx context.Context) (warmpool.Template, error) { return taskrun.WarmTemplate(ctx, in) },
		func(ctx context.Context) (*executor.Outcome, error) { return taskrun.Execute(ctx, in) })
}

// warm runs run; with a warm pool, only once a container of tmpl's key is
// parked, and it fails unless the run took one.
func (e *Env) warm(ctx context.Context, id string, tmpl func(context.Context) (warmpool.Template, error), run func(context.Context) (*executor.Outcome, error)) (*executor.Outcome, error) {
	if e.Pool == nil {
		return run(ctx)
	}
	t, err := tmpl(ctx)
	if err != nil {
		return nil, fmt.Errorf("runtest: warm template: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := e.Pool.WaitReady(wctx, t, 1); err != nil {
		return nil, fmt.Errorf("runtest: %w", err)
	}
	before := e.Pool.Stats().Claims
	out, runErr := run(ctx)
	if e.Pool.Stats().Claims == before {
		return out, errors.Join(runErr, fmt.Errorf("runtest: run %s did not take a warm container (%+v)", id, e.Pool.Stats()))
	}
	return out, runErr
}

// runID is r's ID, for messages.
func runID(r *model.TaskRun) string {
	if r == nil {
		return ""
	}
	return r.ID
}

// Paths is the layout of the Env's run directories.
func (e *Env) Paths() executor.RuntimePaths { return e.Host.Layout().Paths() }

// Spec is a run of cmd in image, placed by the Env's IDs, for its host
// (Run). The caller sets the Updater (and whatever else the test needs).
func (e *Env) Spec(runID, image string, cmd ...string) executor.Spec {
	return executor.Spec{
		Task:      &model.Task{ID: e.TaskID, UserID: e.Tenant, ConversationID: e.ConversationID},
		Run:       &model.TaskRun{ID: runID, TaskID: e.TaskID},
		SessionID: e.SessionID,
		Image:     image,
		Command:   cmd,
		Labels:    maps.Clone(e.Labels),
	}
}

// Input is Spec as the seed API's RunTaskInput on the Env's machine (its
// backend, store, root, helpers, pull policy and warm pool), with the
// host's defaults (the default policy, DefaultTimeout) filled in, for
// tests of the root facade (Execute, taskrun.Execute). Like the Env's
// host, it leases no uid per run (SharedUID) and, without
// Options.HelpersDir, has no self-check (NoSelfCheck): a test that sets
// HelpersDir or UIDs on it gets those.
// The caller sets the Updater (and whatever else the test needs).
func (e *Env) Input(runID, image string, cmd ...string) taskrun.RunTaskInput {
	s, c := e.Spec(runID, image, cmd...), e.Config
	return taskrun.RunTaskInput{
		Task: s.Task, Run: s.Run, SessionID: s.SessionID, Image: s.Image, Command: s.Command, Labels: s.Labels,
		Policy: e.Host.Defaults().Policy, Timeout: e.Host.Defaults().Timeout,
		Paths: e.Paths(), Persist: e.Store, ArtifactStorage: e.Store, StoreURL: c.StoreURL,
		Sandbox: e.Backend, Pull: c.Pull, HelpersDir: c.HelpersDir, Executor: c.Executor, WarmPool: e.Pool,
		UIDs: c.UIDs, SharedUID: c.UIDs == nil, NoSelfCheck: c.HelpersDir == "" && len(c.Helpers) == 0,
	}
}

// Ref names one of the Env's runs.
func (e *Env) Ref(runID string) persist.RunRef {
	return persist.RunRef{UserID: e.Tenant, ConversationID: e.ConversationID, TaskID: e.TaskID, RunID: runID}
}

// RunDir is the host directory of a run.
func (e *Env) RunDir(runID string) string {
	return e.Paths().RuntimeTaskRunDir(e.Tenant, e.ConversationID, e.TaskID, runID)
}

// RunFile reads a stored run object, e.g. executor.OutputLogName.
func (e *Env) RunFile(ctx context.Context, runID, name string) ([]byte, error) {
	return readAll(e.Store.OpenRunFile(ctx, e.Ref(runID), name))
}

// Artifact reads a stored artifact by its path under artifacts/.
func (e *Env) Artifact(ctx context.Context, runID, relPath string) ([]byte, error) {
	return readAll(e.Store.OpenArtifact(ctx, e.Ref(runID), relPath))
}

// GlobalFile reads a stored run-global file, e.g. a trace.
func (e *Env) GlobalFile(ctx context.Context, relPath string) ([]byte, error) {
	return readAll(e.Store.OpenGlobalFile(ctx, e.Tenant, relPath))
}

// Keys lists every key stored for the tenant.
func (e *Env) Keys(ctx context.Context) ([]string, error) {
	prefix, err := persist.TenantPrefix(e.Tenant)
	if err != nil {
		return nil, err
	}
	return e.Store.List(ctx, prefix)
}

// Containers lists the tenant's containers in any state; runID, when
// given, narrows it to that run's.
func (e *Env) Containers(ctx context.Context, runID ...string) ([]string, error) {
	labels := map[string]string{sandbox.LabelTenant: e.Tenant}
	if len(runID) > 0 {
		labels[sandbox.LabelRun] = runID[0]
	}
	return ListContainers(ctx, labels)
}

// RemoveContainers force-removes every container of the tenant.
func (e *Env) RemoveContainers(ctx context.Context) error {
	return RemoveContainers(ctx, map[string]string{sandbox.LabelTenant: e.Tenant})
}

// ListContainers lists the IDs of the containers, in any state, carrying
// all of labels. An empty label set is refused: it would match every
// container on the engine.
func ListContainers(ctx context.Context, labels map[string]string) ([]string, error) {
	cli, args, err := labelled(labels)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: args})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	ids := make([]string, len(list))
	for i, c := range list {
		ids[i] = c.ID
	}
	return ids, nil
}

// RemoveContainers force-removes every container that carries all of
// labels. An empty label set is refused.
func RemoveContainers(ctx context.Context, labels map[string]string) error {
	ids, err := ListContainers(ctx, labels)
	if err != nil {
		return err
	}
	cli, err := dockerClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	var errs []error
	for _, id := range ids {
		if err := cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove container %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

func labelled(labels map[string]string) (*client.Client, filters.Args, error) {
	if len(labels) == 0 {
		return nil, filters.Args{}, fmt.Errorf("%w: give at least one label", ErrBadOptions)
	}
	cli, err := dockerClient()
	if err != nil {
		return nil, filters.Args{}, err
	}
	args := filters.NewArgs()
	for k, v := range labels {
		args.Add("label", k+"="+v)
	}
	return cli, args, nil
}

func dockerClient() (*client.Client, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	return cli, nil
}

func readAll(rc io.ReadCloser, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// RandomID is a short random [a-z0-9] string for unique names.
func RandomID() string { return strings.ToLower(rand.Text()[:12]) }
