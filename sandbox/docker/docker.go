// Package docker implements sandbox.Backend on the Docker Engine API.
//
// Each run is one container created from the Spec and Policy by a pure mapping
// (see convert.go), attached to before it starts so no output is lost, waited on
// with a wait registered before start, stopped with a grace period on timeout or
// cancellation, drained fully and then inspected for its exit code and OOM kill.
// Containers carry dev.taskrun.* labels so Reap can remove what a crashed
// executor left behind.
//
// The engine is found through DOCKER_HOST, DOCKER_TLS_VERIFY and
// DOCKER_CERT_PATH, and the API version is negotiated with the daemon.
package docker

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// Defaults of the backend's options.
const (
	// DefaultStopGrace is the SIGTERM-to-SIGKILL grace when a Spec sets none.
	DefaultStopGrace = 10 * time.Second
	// DefaultExpirySlack is added to timeout and grace in the expiry label.
	DefaultExpirySlack = 5 * time.Minute
	// DefaultDrainIdle is how long Wait waits for output after the container
	// exited without any byte arriving before it gives up on the streams.
	DefaultDrainIdle = 30 * time.Second
	// minAPIVersion is the oldest Engine API with wait conditions (Docker 17.06).
	minAPIVersion = "1.30"
	// pingTimeout bounds the reachability check in New.
	pingTimeout = 10 * time.Second
	// cleanupTimeout bounds stop, kill, inspect and remove calls made on a
	// context detached from the caller's.
	cleanupTimeout = 30 * time.Second
)

// imageNeeds is what an image needs to start under the sandbox policy,
// named when it does not.
const imageNeeds = "an agent image needs its command to exist and to be readable and executable by any uid (a static or self-contained binary), since runs use a uid of their own and a read-only root filesystem"

// Backend runs sandbox containers on a Docker Engine. It is safe for
// concurrent use.
type Backend struct {
	api         dockerAPI
	log         *slog.Logger
	stopGrace   time.Duration
	expirySlack time.Duration
	drainIdle   time.Duration
	now         func() time.Time
	instance    string
	// instanceProcess is the executor's process record (WithInstanceProcess).
	instanceProcess string

	// progress, when set, is the terminal pulls are shown on (fd
	// progressFd); dockerConfig is the docker CLI config directory for
	// registry credentials ("" for DOCKER_CONFIG or ~/.docker).
	progress     io.Writer
	progressFd   uintptr
	dockerConfig string
	pullTimeout  time.Duration

	mu   sync.Mutex
	live map[string]*handle

	// ckOnce guards ckKinds and runsc, read from the engine once (see
	// checkpointRuntimes); runscRoot is runsc's state directory.
	ckOnce    sync.Once
	ckKinds   map[string]sandbox.CheckpointKind
	runsc     string
	runscRoot string
}

// Option configures a Backend.
type Option func(*Backend)

// WithLogger sets the logger; the default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(b *Backend) { b.log = l } }

// WithClock sets the backend's clock: the creation time it records on
// containers and the time the reaper judges ages against. Tests move it
// instead of sleeping.
func WithClock(now func() time.Time) Option { return func(b *Backend) { b.now = now } }

// WithStopGrace sets the grace period used when a Spec sets no StopGrace.
func WithStopGrace(d time.Duration) Option { return func(b *Backend) { b.stopGrace = d } }

// WithExpirySlack sets the margin added to timeout and grace in the
// dev.taskrun.expires label.
func WithExpirySlack(d time.Duration) Option { return func(b *Backend) { b.expirySlack = d } }

// WithDrainIdle sets how long Wait keeps reading output after the container
// exited while no byte arrives (a guard against attach streams that never
// close, moby #36516).
func WithDrainIdle(d time.Duration) Option { return func(b *Backend) { b.drainIdle = d } }

// WithInstance labels every container the backend creates with the
// executor's instance ID (sandbox.LabelInstance), so that Reap run by any other
// executor leaves them alone while this one lives.
func WithInstance(id string) Option { return func(b *Backend) { b.instance = id } }

// WithInstanceProcess labels every container the backend creates with the
// executor's process record (sandbox.LabelInstanceProcess, see
// instance.Info.Process), by which a reaper proves the executor gone even
// once its lock file is removed.
func WithInstanceProcess(process string) Option {
	return func(b *Backend) { b.instanceProcess = process }
}

// Instance returns the executor instance ID the backend labels containers
// with, or "" when none was set.
func (b *Backend) Instance() string { return b.instance }

// New connects to the Docker Engine named by the environment and checks that it
// answers. When it does not, the error wraps sandbox.ErrDaemonUnavailable.
func New(ctx context.Context, opts ...Option) (*Backend, error) {
	api, err := newDockerAPI()
	if err != nil {
		return nil, fmt.Errorf("docker client from environment: %w (check DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH)", err)
	}
	b := &Backend{
		api:         api,
		log:         slog.Default(),
		stopGrace:   DefaultStopGrace,
		expirySlack: DefaultExpirySlack,
		drainIdle:   DefaultDrainIdle,
		now:         time.Now,
		live:        map[string]*handle{},
		runscRoot:   DefaultRunscRoot,
	}
	for _, o := range opts {
		o(b)
	}
	if err := b.ping(ctx); err != nil {
		_ = api.Close()
		return nil, err
	}
	return b, nil
}

// ping checks the daemon answers and speaks a recent enough API.
func (b *Backend) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	p, err := b.api.Ping(ctx)
	if err != nil {
		return fmt.Errorf("%w at %s: %w; start dockerd or set DOCKER_HOST to a reachable engine",
			sandbox.ErrDaemonUnavailable, b.api.DaemonHost(), err)
	}
	negotiate(b.api, p)
	if versionLess(p.APIVersion, minAPIVersion) {
		return fmt.Errorf("%w: engine at %s speaks API %s, taskrun needs %s or newer; upgrade Docker",
			sandbox.ErrDaemonUnavailable, b.api.DaemonHost(), p.APIVersion, minAPIVersion)
	}
	return nil
}

// Close releases the client's connections. Handles must be closed first.
func (b *Backend) Close() error { return b.api.Close() }

// Start creates the container, attaches to its output, registers a wait for its
// exit and starts it. On error nothing is left behind.
func (b *Backend) Start(ctx context.Context, spec sandbox.Spec, pol sandbox.Policy, streams sandbox.Streams) (sandbox.Handle, error) {
	c, err := b.Create(ctx, spec, pol)
	if err != nil {
		return nil, err
	}
	return c.Start(ctx, streams)
}

// Create creates the run's container without starting it (sandbox.Creator).
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec, pol sandbox.Policy) (sandbox.Created, error) {
	if err := pol.Validate(); err != nil {
		return nil, err
	}
	if err := validateSpec(spec); err != nil {
		return nil, err
	}
	spec, pol, err := b.restoreSpec(spec, pol)
	if err != nil {
		return nil, err
	}
	if spec.StopGrace <= 0 {
		spec.StopGrace = b.stopGrace
	}
	defer timings.FromContext(ctx).Start(timings.Create)()
	spec, err = b.resolveWrapper(ctx, spec)
	if err != nil {
		return nil, err
	}
	cc := convert(spec, pol, b.now(), b.expirySlack)
	setInstance(cc.Config.Labels, b.instance, b.instanceProcess)
	created, err := b.api.ContainerCreate(ctx, cc.Config, cc.Host, cc.Network, cc.Name)
	if err != nil && cc.Name != "" && isConflict(err) {
		// The name is taken, by a container of a reused run ID that is
		// still being removed: keep it recognisable and make it unique.
		created, err = b.api.ContainerCreate(ctx, cc.Config, cc.Host, cc.Network, cc.Name+"-"+strings.ToLower(rand.Text()[:8]))
	}
	if err != nil {
		return nil, b.createError(spec, err)
	}
	return &createdContainer{b: b, id: created.ID, spec: spec, pol: pol}, nil
}

// createdContainer is a container Create made (sandbox.Created).
type createdContainer struct {
	b    *Backend
	id   string
	spec sandbox.Spec
	pol  sandbox.Policy
}

func (c *createdContainer) ID() string { return c.id }

// Start attaches to the container, registers the wait for its exit and
// starts it.
func (c *createdContainer) Start(ctx context.Context, streams sandbox.Streams) (sandbox.Handle, error) {
	h := newHandle(c.b, c.id, c.spec, streams)
	if err := h.start(ctx, timings.FromContext(ctx)); err != nil {
		h.discard(ctx)
		return nil, err
	}
	c.b.register(h)
	c.b.log.DebugContext(ctx, "sandbox started", "container", h.id, "run", c.spec.Run.RunID, "image", c.spec.Image, "runtime", c.pol.Runtime)
	return h, nil
}

// Discard removes the container, never started.
func (c *createdContainer) Discard(ctx context.Context) error {
	return c.b.removeContainer(ctx, c.id)
}

// resolveWrapper puts a Spec.Wrapper in front of the command the container
// would otherwise run, looking up the image's own entrypoint and command only
// when the Spec does not replace them.
func (b *Backend) resolveWrapper(ctx context.Context, spec sandbox.Spec) (sandbox.Spec, error) {
	if len(spec.Wrapper) == 0 {
		return spec, nil
	}
	var imgEntrypoint, imgCmd []string
	if len(spec.Entrypoint) == 0 {
		info, err := b.api.ImageInspect(ctx, spec.Image)
		if err != nil {
			return spec, b.createError(spec, err)
		}
		if info.Config != nil {
			imgEntrypoint, imgCmd = info.Config.Entrypoint, info.Config.Cmd
		}
	}
	return wrapCommand(spec, imgEntrypoint, imgCmd)
}

// CheckImage reports whether image exists locally (sandbox.ImageChecker);
// the error wraps sandbox.ErrImageNotFound or sandbox.ErrDaemonUnavailable
// and names the fix.
func (b *Backend) CheckImage(ctx context.Context, image string) error {
	_, err := b.api.ImageInspect(ctx, image)
	if err != nil {
		return b.createError(sandbox.Spec{Image: image}, err)
	}
	return nil
}

// HostFacts reads the engine's host facts from `docker info`
// (sandbox.EngineDescriber).
func (b *Backend) HostFacts(ctx context.Context) (sandbox.HostFacts, error) {
	info, err := b.api.Info(ctx)
	if err != nil {
		return sandbox.HostFacts{}, fmt.Errorf("docker info: %w", err)
	}
	return HostFactsFromInfo(info), nil
}

// setInstance sets the instance label to id, or removes it (whoever set it)
// when the backend has no instance.
func setInstance(labels map[string]string, id, process string) {
	delete(labels, sandbox.LabelInstanceProcess)
	if id == "" {
		delete(labels, sandbox.LabelInstance)
		return
	}
	labels[sandbox.LabelInstance] = id
	if process != "" {
		labels[sandbox.LabelInstanceProcess] = process
	}
}

// createError explains a failed ContainerCreate or image lookup.
func (b *Backend) createError(spec sandbox.Spec, err error) error {
	switch {
	case isNotFound(err):
		return fmt.Errorf("create container: %w locally: %q: %w; build it with `taskrun images build` (or `make images`) or pull it (taskrun run --pull missing)",
			sandbox.ErrImageNotFound, spec.Image, err)
	case isConnectionFailed(err):
		return fmt.Errorf("create container: %w at %s: %w; start dockerd or set DOCKER_HOST",
			sandbox.ErrDaemonUnavailable, b.api.DaemonHost(), err)
	default:
		return fmt.Errorf("create container from %q: %w", spec.Image, err)
	}
}

// register records a live handle; the reaper never touches its container.
func (b *Backend) register(h *handle) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.live[h.id] = h
}

// unregister forgets a handle.
func (b *Backend) unregister(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.live, id)
}

// isLive reports whether this backend holds a handle for the container.
func (b *Backend) isLive(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.live[id]
	return ok
}

// removeContainer force-removes a container on a context detached from ctx's
// cancellation. A container that is already gone is not an error.
func (b *Backend) removeContainer(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err := b.api.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if err == nil || isNotFound(err) || isConflict(err) && b.waitGone(ctx, id) {
		return nil
	}
	return fmt.Errorf("remove container %s: %w", shortID(id), err)
}

// waitGone waits until the container no longer exists (another removal of it is
// in progress) or ctx ends, and reports whether it is gone.
func (b *Backend) waitGone(ctx context.Context, id string) bool {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, _, err := b.api.ContainerInspectWithRaw(ctx, id, false); isNotFound(err) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// shortID is the 12-character form of a container ID used in messages.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

var (
	_ sandbox.Backend         = (*Backend)(nil)
	_ sandbox.EngineDescriber = (*Backend)(nil)
	_ sandbox.ImageResolver   = (*Backend)(nil)
)

// Capabilities states what the Docker backend does beyond sandbox.Backend
// (sandbox.Capable): it creates ahead, bind-mounts the run directory,
// describes its engine, resolves images, limits pids per container and
// samples a container's cgroup counters through the engine's stats. It
// keeps the memory of gVisor runs in a checkpoint when the engine has the
// restore runtime (Checkpoint).
func (b *Backend) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{
		Kind:           sandbox.BackendDocker,
		CreatesAhead:   true,
		SharesRunDir:   true,
		DescribesHost:  true,
		ResolvesImages: true,
		ChecksImages:   true,
		LimitsPids:     true,
		Stats:          true,
		// ListsContainers: orphan.go and ReapGone.
		ListsContainers: true,
		Checkpoints:     b.checkpointRuntimes(),
	}
}
