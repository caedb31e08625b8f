package executor

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// supervise runs the container l, its output going to the streams the
// Prestart hooks made: the gates beside it for exactly as long as it
// lives, and the Poststart and Exited hooks around it. The returned error
// is the run's failure, if any; the execution is filled as far as the run
// got. hard is the run's shutdown context (shutdownContext): the output
// consumers outlive ctx's cancellation, but not hard.
func (r *runner) supervise(ctx, hard context.Context, l *launch) (h sandbox.Handle, ex execution, err error) {
	p := r.p
	// The engine's host facts, which the live audit needs, are read while
	// the container starts.
	hostFacts := prefetchHostFacts(ctx, p.in.Sandbox, p.caps, l.created)
	// The backend splits its Start into create, attach and start through
	// the context; the first stdout byte and the self-check's report (the
	// first stderr line) are timed from the start request.
	launched := p.timings.Now()
	streams := sandbox.Streams{Stdout: p.timings.FirstWrite(r.stdout, timings.FirstByte, launched), Stderr: r.stderr}
	if r.selfCheck {
		streams.Stderr = p.timings.FirstWrite(r.stderr, timings.SelfCheck, launched)
	}
	h, err = l.start(timings.NewContext(ctx, p.timings), p, streams)
	p.timings.Since(timings.Launch, launched)
	if err != nil {
		return nil, ex, fmt.Errorf("start sandbox: %w", err)
	}
	ex.ContainerID, ex.Runtime, ex.ImageDigest = h.ID(), p.policy.Runtime, p.image.Digest()
	p.log.Info("container started", "container", h.ID(), "image", l.spec.Image, "runtime", p.policy.Runtime)

	// The gates run while the container starts; the self-check holds the
	// agent until they passed. A container that is not confined as asked
	// is stopped at once and its agent never runs. RUNNING is reported
	// once the agent was let go.
	waitCtx, stop := context.WithCancel(ctx)
	defer stop()
	gateCtx, endGates := context.WithCancel(waitCtx)
	defer endGates()
	gated := r.gates(ctx, gateCtx, stop, ex, &gateRequest{Run: ctx, Handle: h, HostFacts: hostFacts})
	r.tr.trace(ctx, transition{state: stateStarted, containerID: h.ID()})
	r.poststart(ctx, &poststartRequest{Stop: stop, Hard: hard, Handle: h})
	r.started(h, stop)

	stopWait := p.timings.Start(timings.Wait)
	res := h.Wait(waitCtx)
	stopWait()
	// A pause under way ends before the run goes on.
	r.containerExited()
	// A self-check that never asked for the go-ahead (it refused, or the
	// run was stopped first) no longer holds the gates up.
	stopRecords := p.timings.Start(timings.Records)
	endGates()
	g := <-gated
	stopRecords()
	if g.resp.ImageDigest != "" || g.resp.Runtime != "" {
		ex.ImageDigest, ex.Runtime = g.resp.ImageDigest, g.resp.Runtime
	}
	ex.Exit = res
	// What served the container stops with it (the Exited hooks), so the
	// records hold their totals.
	resp, exitedErr := r.exited(ctx, res)
	ex.apply(resp)
	return h, ex, errors.Join(g.err, exitedErr, res.Err)
}

// gated is what the gates found.
type gated struct {
	resp gateResponse
	err  error
}

// gates runs the gate hooks, in order, in the background from the
// container's start: the first failure stops the container (stop);
// RUNNING is traced once every gate let the agent go, with ex as the
// execution so far. ctx ends once the container exited.
func (r *runner) gates(runCtx, ctx context.Context, stop context.CancelFunc, ex execution, req *gateRequest) <-chan gated {
	var gs []gateHook
	for _, h := range r.hooks {
		if g, ok := h.(gateHook); ok {
			r.tr.step("poststart:" + h.name())
			gs = append(gs, g)
		}
	}
	out := make(chan gated, 1)
	go func() {
		var g gated
		g.resp.GoAhead = true
		for _, gh := range gs {
			var resp gateResponse
			err := gh.gate(ctx, req, &resp)
			g.resp.ImageDigest, g.resp.Runtime = cmp.Or(resp.ImageDigest, g.resp.ImageDigest), cmp.Or(resp.Runtime, g.resp.Runtime)
			if err != nil {
				g.err = err
				stop()
				break
			}
			g.resp.GoAhead = g.resp.GoAhead && resp.GoAhead
		}
		if g.err == nil && g.resp.GoAhead {
			running := ex
			running.ImageDigest, running.Runtime = cmp.Or(g.resp.ImageDigest, ex.ImageDigest), cmp.Or(g.resp.Runtime, ex.Runtime)
			r.tr.trace(runCtx, transition{state: stateRunning, ex: &running})
		}
		out <- g
	}()
	return out
}

// removeContainer removes the run's container h in the background, on a
// context detached from ctx's cancellation; the returned channel is closed
// once it is gone (or removing it failed, which is logged: the reaper
// finds it by its labels). It is nil when no container started.
func (r *runner) removeContainer(ctx context.Context, h sandbox.Handle) <-chan struct{} {
	if h == nil {
		return nil
	}
	p := r.p
	r.tr.step("remove")
	done := make(chan struct{})
	go func() {
		defer close(done)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		defer p.timings.Start(timings.Remove)()
		if err := h.Close(closeCtx); err != nil {
			p.log.Warn("remove container", "container", h.ID(), "err", err)
		}
	}()
	return done
}
