package executor

import (
	"context"

	"github.com/taskrun/taskrun/timings"

	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/sandbox"
)

// launch is the run's container before it starts: its spec and policy
// and, where the backend can create a
// container ahead of starting it (sandbox.Creator), the container the engine
// creates while prepare fills the run directory.
type launch struct {
	spec   sandbox.Spec
	policy sandbox.Policy
	// created is closed once the early create returned, with container or
	// err; nil when the container is created at start.
	created   chan struct{}
	container sandbox.Created
	err       error
	// started is set once Start was called on container.
	started bool
	// startWith starts a container not created ahead (starterOf).
	startWith func(context.Context, sandbox.Spec, sandbox.Policy, sandbox.Streams) (sandbox.Handle, error)
}

// newLaunch builds the container of a run of p in wd: the planned spec
// and the relay, then what each Configure hook adds (the self-check's
// wrapper goes in front of every other).
func newLaunch(p *plan, wd *workdir, hooks []hook) *launch {
	spec := p.containerSpec()
	wrapRelay(p, &spec)
	configureAll(hooks, &spec)
	if p.in.restore != nil && p.in.restore.manifest.Kind == sandbox.CheckpointMemory {
		spec.RestoreFrom = p.in.restore.dir
		spec.Mounts = append(spec.Mounts, p.restoreMounts...)
	}
	return &launch{spec: spec, policy: wd.policy(p), startWith: starterOf(hooks, p.in.Sandbox)}
}

// wrapRelay runs the command behind the relay (after the self-check, which
// wraps everything) when the run has a model or an egress policy and the
// relay is among its helpers: the agent finds the model gateway at
// OPENAI_BASE_URL and ANTHROPIC_BASE_URL, and the egress proxy at
// HTTP_PROXY, whatever its command. An agent that starts the relay itself
// as well still works: a relay under a relay only runs its command.
func wrapRelay(p *plan, spec *sandbox.Spec) {
	if p.in.Model.IsZero() && p.in.Egress.IsZero() {
		return
	}
	if _, ok := p.helpers[helpers.RelayName]; !ok {
		return
	}
	spec.Wrapper = append(spec.Wrapper, helpers.RelayPath, "--")
}

// start starts the container with streams: the one created ahead, the
// warm slot's, or one the backend creates now.
func (l *launch) start(ctx context.Context, p *plan, streams sandbox.Streams) (sandbox.Handle, error) {
	if l.created == nil {
		return l.startWith(ctx, l.spec, l.policy, streams)
	}
	<-l.created
	if l.err != nil {
		return nil, l.err
	}
	l.started = true
	return l.container.Start(ctx, streams)
}

// discardUnstarted removes a container created ahead that never started
// (prepare or supervise failed before it), on a context detached from the
// run's cancellation.
func (l *launch) discardUnstarted(ctx context.Context, p *plan) {
	if l == nil || l.created == nil {
		return
	}
	<-l.created
	if l.container == nil || l.started {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := l.container.Discard(ctx); err != nil {
		p.log.Warn("remove the container created for the run", "container", l.container.ID(), "err", err)
	}
}

// createAhead plans the container and has the engine create it in the
// background, when the backend can (CreatesAhead); nil otherwise.
func (r *runner) createAhead(ctx context.Context) *launch {
	p := r.p
	if !p.caps.CreatesAhead {
		return nil
	}
	c := p.in.Sandbox.(sandbox.Creator) // the method of caps.CreatesAhead
	l := newLaunch(p, r.wd, r.hooks)
	l.created = make(chan struct{})
	r.tr.step("create")
	go func() {
		defer close(l.created)
		l.container, l.err = c.Create(timings.NewContext(ctx, p.timings), l.spec, l.policy)
	}()
	return l
}

// starterOf is what starts the run's container: a hook that starts it
// itself (starterHook), or else the backend.
func starterOf(hooks []hook, b sandbox.Backend) func(context.Context, sandbox.Spec, sandbox.Policy, sandbox.Streams) (sandbox.Handle, error) {
	for _, h := range hooks {
		if s, ok := h.(starterHook); ok {
			return func(ctx context.Context, spec sandbox.Spec, _ sandbox.Policy, streams sandbox.Streams) (sandbox.Handle, error) {
				return s.start(ctx, spec, streams)
			}
		}
	}
	return b.Start
}
