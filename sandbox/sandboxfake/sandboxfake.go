// Package sandboxfake is an in-memory sandbox.Backend for tests of code that
// runs containers (the orchestration in package taskrun). A fake container
// runs a Go function, a Program, in place of a process: it sees the Spec's
// environment and mounts and writes to the run's stdout and stderr, and it can
// be made to time out, be OOM-killed, hang past its stop grace or fail to
// start. It confines nothing: what it reports as its posture is its Policy,
// applied by construction. Every guarantee it stands in for is tested against
// the Docker backend.
//
// It passes the portable cases of sandboxtest; see its Capabilities.
package sandboxfake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/seccomp"
	"github.com/taskrun/taskrun/timings"
)

// Program is what a fake container runs. ctx ends when the container is
// killed (SIGKILL); p.Terminated closes when it is asked to stop (SIGTERM).
// The returned int is the exit code.
type Program func(ctx context.Context, p *Process) int

// KilledExitCode is the exit code of a container killed by SIGKILL (an OOM
// kill, or a stop that outlasted the grace period).
const KilledExitCode = 137

// ErrNoProgram is returned by Start when no Program is installed for the
// container's command and there is no default.
var ErrNoProgram = errors.New("sandboxfake: no program for the command")

// ErrStart is wrapped by the error of a Start that was told to fail.
var ErrStart = errors.New("sandboxfake: start failed")

// Backend runs fake containers. The zero value is not usable; call New.
type Backend struct {
	mu       sync.Mutex
	programs map[string]Program
	def      Program
	images   map[string]bool // nil: every image exists
	startErr error
	tamper   func(*sandbox.Posture)
	host     sandbox.HostFacts
	maxGrace time.Duration
	live     map[string]*handle
	pending  map[string]*created
	started  []sandbox.Spec
	resolved []string
	// statsReads counts the calls of every handle's Stats.
	statsReads atomic.Int64
}

// Option configures a Backend.
type Option func(*Backend)

// WithDefault sets the Program run when no installed Program matches the
// command.
func WithDefault(p Program) Option { return func(b *Backend) { b.def = p } }

// WithImages makes only the named images exist: CheckImage and Start refuse
// any other with sandbox.ErrImageNotFound. By default every image exists.
func WithImages(images ...string) Option {
	return func(b *Backend) {
		b.images = map[string]bool{}
		for _, i := range images {
			b.images[i] = true
		}
	}
}

// WithStartError makes every Start fail; see FailStarts.
func WithStartError(err error) Option { return func(b *Backend) { b.startErr = err } }

// FailStarts makes every later Start fail with an error wrapping ErrStart
// and err, after validating its input, as an engine that cannot create or
// start the container does. A nil err lets Starts succeed again.
func (b *Backend) FailStarts(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startErr = err
}

// WithPosture lets f change the posture the backend reports, as an engine
// that did not apply part of the policy would.
func WithPosture(f func(*sandbox.Posture)) Option { return func(b *Backend) { b.tamper = f } }

// WithHostFacts sets the host facts the backend reports.
func WithHostFacts(h sandbox.HostFacts) Option { return func(b *Backend) { b.host = h } }

// WithMaxStopGrace caps the stop grace of every container, so a test of a
// container that ignores SIGTERM does not wait out the Spec's grace.
func WithMaxStopGrace(d time.Duration) Option { return func(b *Backend) { b.maxGrace = d } }

// New returns a backend with no containers.
func New(opts ...Option) *Backend {
	b := &Backend{
		programs: map[string]Program{},
		live:     map[string]*handle{},
		host:     sandbox.HostFacts{Seccomp: true, ServerVersion: "sandboxfake", Runtimes: []string{"fake"}},
	}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Install makes the containers whose command (Wrapper, else Entrypoint, else
// Cmd) starts with name run p.
func (b *Backend) Install(name string, p Program) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.programs[name] = p
}

// Containers returns the IDs of the containers that exist (created, and
// neither discarded nor closed) whose labels include all of labels.
func (b *Backend) Containers(labels map[string]string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []string
	for id, h := range b.live {
		if hasLabels(h.labels, labels) {
			ids = append(ids, id)
		}
	}
	for id, c := range b.pending {
		if hasLabels(c.labels, labels) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Started returns the Specs of every Start that created a container, in order.
func (b *Backend) Started() []sandbox.Spec {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.started)
}

// CheckImage implements sandbox.ImageChecker.
func (b *Backend) CheckImage(ctx context.Context, image string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.images != nil && !b.images[image] {
		return fmt.Errorf("%w: %s: build it first", sandbox.ErrImageNotFound, image)
	}
	return nil
}

// ResolveImage implements sandbox.ImageResolver: an image that exists (see
// WithImages) resolves, whatever the pull policy, to the ID its containers
// report (ImageID), with a repo digest when ref is a digest reference. Every
// call is recorded (Resolved).
func (b *Backend) ResolveImage(ctx context.Context, ref string, pull sandbox.PullPolicy) (sandbox.Image, error) {
	b.mu.Lock()
	b.resolved = append(b.resolved, ref)
	b.mu.Unlock()
	if err := b.CheckImage(ctx, ref); err != nil {
		return sandbox.Image{}, err
	}
	img := sandbox.Image{Ref: ref, ID: ImageID(ref)}
	if strings.Contains(ref, "@") {
		img.RepoDigest = ref
	}
	return img, nil
}

// Resolved returns the image references ResolveImage was asked for, in
// order.
func (b *Backend) Resolved() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.resolved)
}

// ImageID is the image ID the fake reports for containers of image.
func ImageID(image string) string { return "sha256:" + hex.EncodeToString([]byte(image)) }

// HostFacts implements sandbox.EngineDescriber.
func (b *Backend) HostFacts(ctx context.Context) (sandbox.HostFacts, error) {
	if err := ctx.Err(); err != nil {
		return sandbox.HostFacts{}, err
	}
	return b.host, nil
}

// Start implements sandbox.Backend: it validates the input as an engine
// would (policy, image, bind-mount sources), then runs the Program in a
// goroutine whose output goes to streams.
func (b *Backend) Start(ctx context.Context, spec sandbox.Spec, policy sandbox.Policy, streams sandbox.Streams) (sandbox.Handle, error) {
	c, err := b.Create(ctx, spec, policy)
	if err != nil {
		return nil, err
	}
	return c.Start(ctx, streams)
}

// Create implements sandbox.Creator: it validates the input as Start does
// and picks the Program; the container counts as Pending until it is
// started or discarded.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec, policy sandbox.Policy) (sandbox.Created, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	if err := b.CheckImage(ctx, spec.Image); err != nil {
		return nil, err
	}
	if spec.RestoreFrom != "" {
		return nil, fmt.Errorf("sandboxfake: restore from %s: %w", spec.RestoreFrom, sandbox.ErrCheckpointUnsupported)
	}
	for _, m := range spec.Mounts {
		if !filepath.IsAbs(m.Source) || !path.IsAbs(m.Target) {
			return nil, fmt.Errorf("sandboxfake: mount %s -> %s: both paths must be absolute", m.Source, m.Target)
		}
		if _, err := os.Stat(m.Source); err != nil {
			return nil, fmt.Errorf("sandboxfake: bind source: %w", err)
		}
	}
	defer timings.FromContext(ctx).Start(timings.Create)()
	args := command(spec)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.startErr; err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	prog := b.def
	if len(args) > 0 {
		if p, ok := b.programs[args[0]]; ok {
			prog = p
		}
	}
	if prog == nil {
		return nil, fmt.Errorf("%w %q: Install one or set WithDefault", ErrNoProgram, args)
	}
	c := &created{b: b, id: newID(), spec: spec, policy: policy, labels: labels(spec, time.Now()), args: args, prog: prog}
	if b.pending == nil {
		b.pending = map[string]*created{}
	}
	b.pending[c.id] = c
	return c, nil
}

// Pending counts the containers created and neither started nor discarded.
func (b *Backend) Pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// created is a container Create made (sandbox.Created).
type created struct {
	b      *Backend
	id     string
	labels map[string]string
	spec   sandbox.Spec
	policy sandbox.Policy
	args   []string
	prog   Program
	done   bool
}

func (c *created) ID() string { return c.id }

// Start runs the container's Program.
func (c *created) Start(ctx context.Context, streams sandbox.Streams) (sandbox.Handle, error) {
	if err := c.settle(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start container: %w", err)
	}
	b := c.b
	h := newHandle(b, c.spec, c.policy, streams, c.args)
	b.mu.Lock()
	b.live[h.id] = h
	b.started = append(b.started, c.spec)
	b.mu.Unlock()
	defer timings.FromContext(ctx).Start(timings.Start)()
	go h.run(c.prog)
	return h, nil
}

// Discard forgets the container.
func (c *created) Discard(context.Context) error { return c.settle() }

// settle ends the container's pending state, once.
func (c *created) settle() error {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if c.done {
		return errors.New("sandboxfake: container already started or discarded")
	}
	c.done = true
	delete(c.b.pending, c.id)
	return nil
}

// command is the argv a container runs: the Wrapper, then the entrypoint
// and command.
func command(spec sandbox.Spec) []string {
	args := slices.Clone(spec.Wrapper)
	args = append(args, spec.Entrypoint...)
	return append(args, spec.Cmd...)
}

// labels are the container's labels: the Spec's plus the dev.taskrun.*
// labels, which win, as the Docker backend sets them.
func labels(spec sandbox.Spec, created time.Time) map[string]string {
	out := maps.Clone(spec.Labels)
	if out == nil {
		out = map[string]string{}
	}
	out[sandbox.LabelManaged] = "true"
	out[sandbox.LabelTenant] = spec.Run.UserID
	out[sandbox.LabelConversation] = spec.Run.ConversationID
	out[sandbox.LabelTask] = spec.Run.TaskID
	out[sandbox.LabelRun] = spec.Run.RunID
	out[sandbox.LabelCreated] = created.UTC().Format(time.RFC3339)
	return out
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func (b *Backend) remove(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.live, id)
}

// posture is what the container reports: its policy, applied by
// construction, then whatever WithPosture changes.
func (b *Backend) posture(h *handle) sandbox.Posture {
	pol := h.policy
	pids := pol.PidsLimit
	runtime := pol.Runtime
	if runtime == "" {
		runtime = "runc"
	}
	p := sandbox.Posture{
		ID:             h.id,
		Name:           "sandboxfake-" + h.id[:12],
		Image:          ImageID(h.spec.Image),
		Labels:         maps.Clone(h.labels),
		User:           pol.User,
		WorkingDir:     h.spec.WorkingDir,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges", "seccomp=" + seccomp.SHA256()},
		ReadonlyRootfs: pol.ReadOnlyRootfs,
		Memory:         pol.MemoryBytes,
		MemorySwap:     pol.MemoryBytes,
		NanoCPUs:       pol.NanoCPUs,
		PidsLimit:      &pids,
		NetworkMode:    pol.NetworkMode,
		IpcMode:        "private",
		Tmpfs:          map[string]string{"/tmp": "rw,nosuid,nodev,exec,size=" + strconv.FormatInt(pol.TmpfsSizeBytes, 10)},
		MaskedPaths:    []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"},
		ReadonlyPaths:  []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		LogDriver:      "json-file",
		LogOpts:        map[string]string{"max-size": pol.LogMaxSize, "max-file": strconv.Itoa(pol.LogMaxFile)},
		Runtime:        runtime,
		Ulimits: []sandbox.Ulimit{
			{Name: "nofile", Soft: pol.NoFile, Hard: pol.NoFile},
			{Name: "core", Soft: 0, Hard: 0},
		},
	}
	for _, m := range h.spec.Mounts {
		p.Mounts = append(p.Mounts, sandbox.PostureMount{
			Type: "bind", Source: m.Source, Destination: m.Target, RW: !m.ReadOnly, Propagation: "rprivate",
		})
	}
	if b.tamper != nil {
		b.tamper(&p)
	}
	return p
}

// newID is a random 64-hex-digit container ID.
func newID() string {
	var p [32]byte
	_, _ = rand.Read(p[:])
	return hex.EncodeToString(p[:])
}

// Process is a fake container's process as its Program sees it.
type Process struct {
	// Args is the command line: Wrapper, Entrypoint, Cmd.
	Args []string
	// Spec and Policy are what the container was started with.
	Spec   sandbox.Spec
	Policy sandbox.Policy
	// Stdout and Stderr are the container's output streams. Writes after
	// the container was killed are discarded.
	Stdout io.Writer
	Stderr io.Writer

	h *handle
}

// Getenv returns the value of key in the Spec's environment.
func (p *Process) Getenv(key string) string {
	for _, kv := range p.Spec.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// Terminated is closed when the container is asked to stop (SIGTERM): on
// timeout, cancellation or Close. A Program that ignores it is killed after
// the stop grace.
func (p *Process) Terminated() <-chan struct{} { return p.h.term }

// OOMKill ends the container as the kernel's OOM killer would: the run is
// reported OOMKilled with KilledExitCode. The Program should return at once.
func (p *Process) OOMKill() int {
	p.h.mu.Lock()
	p.h.oom = true
	p.h.mu.Unlock()
	return KilledExitCode
}

// SetStats sets the figures the container's Stats reports from now on, as
// its cgroup would count them.
func (p *Process) SetStats(s sandbox.Stats) {
	p.h.mu.Lock()
	p.h.stats = s
	p.h.mu.Unlock()
}

// StatsReads counts the calls of the container's Stats so far.
func (p *Process) StatsReads() int64 {
	p.h.mu.Lock()
	defer p.h.mu.Unlock()
	return p.h.reads
}

// StatsReads counts the calls of Stats on every container of b so far.
func (b *Backend) StatsReads() int64 { return b.statsReads.Load() }

// TimeOut ends the container as if its Spec's timeout had passed now: it
// is asked to stop and reported TimedOut.
func (p *Process) TimeOut() {
	p.h.expireOnce.Do(func() { close(p.h.expire) })
}

// HostPath maps a path inside the container to the host path under the
// bind mount that holds it; ok is false when no mount holds it.
func (p *Process) HostPath(inContainer string) (host string, readOnly, ok bool) {
	clean := path.Clean(inContainer)
	best := -1
	for i, m := range p.Spec.Mounts {
		t := path.Clean(m.Target)
		if (clean == t || strings.HasPrefix(clean, strings.TrimSuffix(t, "/")+"/")) && (best < 0 || len(t) > len(path.Clean(p.Spec.Mounts[best].Target))) {
			best = i
		}
	}
	if best < 0 {
		return "", false, false
	}
	m := p.Spec.Mounts[best]
	rel := strings.TrimPrefix(strings.TrimPrefix(clean, path.Clean(m.Target)), "/")
	return filepath.Join(m.Source, filepath.FromSlash(rel)), m.ReadOnly, true
}

// ErrReadOnly is returned by WriteFile for a path on a read-only mount.
var ErrReadOnly = errors.New("read-only file system")

// ReadFile reads a file of a bind mount by its path inside the container.
func (p *Process) ReadFile(inContainer string) ([]byte, error) {
	host, _, ok := p.HostPath(inContainer)
	if !ok {
		return nil, fmt.Errorf("open %s: %w", inContainer, os.ErrNotExist)
	}
	return os.ReadFile(host)
}

// WriteFile writes a file of a bind mount by its path inside the
// container, refused on a read-only mount.
func (p *Process) WriteFile(inContainer string, data []byte) error {
	host, ro, ok := p.HostPath(inContainer)
	switch {
	case !ok:
		return fmt.Errorf("write %s: %w (the root filesystem is read-only)", inContainer, ErrReadOnly)
	case ro:
		return fmt.Errorf("write %s: %w", inContainer, ErrReadOnly)
	}
	if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
		return err
	}
	return os.WriteFile(host, data, 0o644)
}

// Capabilities states what the fake does beyond sandbox.Backend
// (sandbox.Capable): what the Docker backend does.
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
	}
}
