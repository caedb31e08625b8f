package taskrun

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// execution is what supervise observed: the container, how it ended and
// what it cost. It is also kept on disk (run.json) for RetryPersist, hence
// the JSON names.
type execution struct {
	// ContainerID is the container that ran the agent; empty when none ran.
	ContainerID string `json:"container_id,omitempty"`
	// Runtime and ImageDigest describe the container as inspected.
	Runtime     string `json:"runtime,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	// Exit is the container's result.
	Exit sandbox.Result `json:"exit"`
	// PromptTokens and CompletionTokens are the gateway's metering; nil
	// when the run had no model.
	PromptTokens     *int `json:"prompt_tokens,omitempty"`
	CompletionTokens *int `json:"completion_tokens,omitempty"`
	// ModelUpstream says the model upstream was misconfigured or down at the
	// run's last model request (e.g. "model upstream answered 401
	// Unauthorized"); empty when it answered.
	ModelUpstream string `json:"model_upstream,omitempty"`
	// DroppedOutputBytes counts output past the cap, drained but not kept.
	DroppedOutputBytes int64 `json:"dropped_output_bytes,omitempty"`
	// DroppedRecordBytes counts bytes of host-side records (spools, trace
	// lines, gateway record) refused by the run's record budget.
	DroppedRecordBytes int64 `json:"dropped_record_bytes,omitempty"`
	// ReadOnlyRootWrite is set when the agent failed and the end of its
	// stderr reports a write refused by the read-only root filesystem:
	// the image expects to write outside /taskrun and /tmp.
	ReadOnlyRootWrite bool `json:"read_only_root_write,omitempty"`
	// StreamEnded is set once the control plane acknowledged the whole
	// stdout stream and its end; finishStream delivers it otherwise.
	StreamEnded bool `json:"stream_ended,omitempty"`
	// Usage is what the container used, as its backend sampled it; nil
	// when it was not sampled.
	Usage *sandbox.Usage `json:"usage,omitempty"`
	// record is the isolation record (audit.json); nil when no container
	// was inspected.
	record []byte
	// removed is closed once the container is removed; nil when none was
	// started.
	removed <-chan struct{}
}

// awaitRemoved waits until the run's container is gone.
func (ex execution) awaitRemoved() {
	if ex.removed != nil {
		<-ex.removed
	}
}

// lifecycle is how supervise has the runner call the hooks of the
// container's events.
type lifecycle interface {
	// poststart runs the Poststart hooks once the container started.
	poststart(ctx context.Context, req *poststartRequest)
	// exited runs the Exited hooks, once.
	exited(ctx context.Context, res sandbox.Result) (*exitedResponse, error)
}

// apply takes what the Exited hooks reported.
func (ex *execution) apply(resp *exitedResponse) {
	ex.PromptTokens, ex.CompletionTokens, ex.ModelUpstream = resp.PromptTokens, resp.CompletionTokens, resp.ModelUpstream
	ex.ReadOnlyRootWrite, ex.StreamEnded, ex.DroppedOutputBytes = resp.ReadOnlyRootWrite, resp.StreamEnded, resp.DroppedOutputBytes
	ex.Usage = resp.Usage
}

// supervise runs the container l, its output going to stdout and stderr:
// the self-check and the live audit for exactly as long as the container
// lives, and the Poststart and Exited hooks around it. The returned error
// is the run's failure, if any; the execution is filled as far as the run
// got. hard is the run's shutdown context (shutdownContext): the output
// consumers outlive ctx's cancellation, but not hard.
func supervise(ctx, hard context.Context, tr *tracer, l *launch, hooks lifecycle, stdout, stderr io.Writer) (ex execution, err error) {
	p, wd := tr.p, tr.wd
	iso := l.iso
	// The engine's host facts, which the live audit needs, are read while
	// the container starts.
	hostFacts := prefetchHostFacts(ctx, p.in.Sandbox, p.caps, l.created)
	var stderrSink io.Writer = stderr
	if len(p.helpers) > 0 {
		if err := iso.listenHold(p, wd.owner.UID); err != nil {
			return ex, fmt.Errorf("self-check: %w", err)
		}
		defer iso.closeHold()
		stderrSink = iso.intercept(stderr)
	}
	// The backend splits its Start into create, attach and start through
	// the context; the first stdout byte and the self-check's report (the
	// first stderr line) are timed from the start request.
	launched := p.timings.Now()
	streams := sandbox.Streams{Stdout: p.timings.FirstWrite(stdout, timings.FirstByte, launched), Stderr: stderrSink}
	if iso.interceptor != nil {
		streams.Stderr = p.timings.FirstWrite(stderrSink, timings.SelfCheck, launched)
	}
	h, err := l.start(timings.NewContext(ctx, p.timings), p, streams)
	p.timings.Since(timings.Launch, launched)
	if err != nil {
		return ex, fmt.Errorf("start sandbox: %w", err)
	}
	// The container is removed in the background once the run is over, while
	// its outputs are collected; Execute waits for it before the run's uid
	// and directory are released.
	defer func() { ex.removed = removeContainer(ctx, p, h) }()
	ex.ContainerID, ex.Runtime, ex.ImageDigest = h.ID(), p.policy.Runtime, p.image.Digest()
	p.log.Info("container started", "container", h.ID(), "image", l.spec.Image, "runtime", p.policy.Runtime)

	// The live audit runs while the container starts; the self-check holds
	// the agent until it passed. A container that is not confined as asked
	// is stopped at once and its agent never runs. RUNNING is reported once
	// the agent was let go.
	waitCtx, stop := context.WithCancel(ctx)
	defer stop()
	audited := make(chan error, 1)
	go func() {
		err := p.timings.Time(timings.LiveAudit, func() error { return iso.auditLive(ctx, p.caps, h, hostFacts) })
		if err != nil {
			iso.closeHold()
			stop()
		} else if iso.releaseHold(waitCtx) {
			running := ex
			if iso.posture != nil {
				running.ImageDigest, running.Runtime = imageDigest(p.image, iso.posture.Image), iso.posture.Runtime
			}
			tr.trace(ctx, transition{state: stateRunning, ex: &running})
		}
		audited <- err
	}()
	tr.trace(ctx, transition{state: stateStarted, containerID: h.ID()})
	hooks.poststart(ctx, &poststartRequest{Stop: stop, Hard: hard, Handle: h})

	stopWait := p.timings.Start(timings.Wait)
	res := h.Wait(waitCtx)
	stopWait()
	stopRecords := p.timings.Start(timings.Records)
	// A self-check that never asked for the go-ahead (it refused, or the
	// run was stopped first) no longer holds the audit up.
	iso.closeHold()
	auditErr := <-audited
	if iso.posture != nil {
		ex.ImageDigest, ex.Runtime = imageDigest(p.image, iso.posture.Image), iso.posture.Runtime
		iso.imageDigest = ex.ImageDigest
	}
	ex.Exit = res
	probeErr := iso.readProbe(res)
	stopRecords()
	// What served the container stops with it (the Exited hooks), so the
	// records hold their totals.
	resp, exitedErr := hooks.exited(ctx, res)
	ex.apply(resp)
	iso.egress = resp.Egress
	ex.record = iso.record(p.ref.RunID)
	return ex, errors.Join(auditErr, probeErr, exitedErr, res.Err)
}

// removeContainer removes the run's container in the background, on a
// context detached from ctx's cancellation; the returned channel is closed
// once it is gone (or removing it failed, which is logged: the reaper
// finds it by its labels).
func removeContainer(ctx context.Context, p *plan, h sandbox.Handle) <-chan struct{} {
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

// imageDigest is the digest a run's records name its image by: the repo
// digest the image was resolved to, when the container really ran that
// image (ranID, the image ID the engine reports for it), else ranID.
func imageDigest(resolved sandbox.Image, ranID string) string {
	if ranID == "" || resolved.ID == ranID {
		return resolved.Digest()
	}
	return ranID
}
