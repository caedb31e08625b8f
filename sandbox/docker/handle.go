package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// ErrStreamStuck is reported in Result.Err when the attach stream stayed open
// without data for the drain idle period after the container exited; the
// stream is then closed and whatever arrived until then is kept.
var ErrStreamStuck = errors.New("output stream did not close after the container exited")

// waitRetries is how often a broken wait request is re-issued.
const waitRetries = 5

// handle is one container started by Backend.Start.
type handle struct {
	b       *Backend
	id      string
	spec    sandbox.Spec
	stdout  *spoolWriter
	stderr  *spoolWriter
	lastIO  atomic.Int64 // unix nanoseconds of the last byte read or written
	started time.Time

	// runCtx scopes the wait request and lives until Close.
	runCtx    context.Context
	cancelRun context.CancelFunc

	attach   types.HijackedResponse
	attached bool
	pumpDone chan struct{}
	pumpErr  error

	exited   chan struct{}
	exitCode int64
	memory   memoryWatch
	waitErr  error

	waiter    sandbox.Waiter
	closeOnce sync.Once
	closeErr  error
}

// newHandle prepares a handle for a created container.
func newHandle(b *Backend, id string, spec sandbox.Spec, streams sandbox.Streams) *handle {
	runCtx, cancel := context.WithCancel(context.Background())
	h := &handle{
		b:         b,
		id:        id,
		spec:      spec,
		runCtx:    runCtx,
		cancelRun: cancel,
		pumpDone:  make(chan struct{}),
		exited:    make(chan struct{}),
	}
	h.stdout = newSpoolWriter(streams.Stdout, &h.lastIO)
	h.stderr = newSpoolWriter(streams.Stderr, &h.lastIO)
	return h
}

// start attaches, registers the exit wait and starts the container, in that
// order, so that neither the first byte nor a fast exit can be missed.
func (h *handle) start(ctx context.Context, rec *timings.Recorder) error {
	stopAttach := rec.Start(timings.Attach)
	att, err := h.b.api.ContainerAttach(ctx, h.id, container.AttachOptions{Stream: true, Stdout: true, Stderr: true})
	if err != nil {
		return fmt.Errorf("attach to container %s: %w", shortID(h.id), err)
	}
	// The pump starts with the attach, so release can always wait for it,
	// whichever step below fails.
	h.attach, h.attached = att, true
	go h.pump()
	// ContainerWait sends its request before returning, so the daemon has the
	// next-exit waiter registered before ContainerStart below.
	waitC, errC := h.b.api.ContainerWait(h.runCtx, h.id, container.WaitConditionNextExit)
	select {
	case err := <-errC:
		return fmt.Errorf("wait for container %s: %w", shortID(h.id), err)
	default:
	}
	go h.watch(waitC, errC)
	stopAttach()
	stopStart := rec.Start(timings.Start)
	defer stopStart()
	if err := h.b.api.ContainerStart(ctx, h.id, container.StartOptions{}); err != nil {
		if isInvalidArgument(err) {
			// The runtime could not exec the command: the engine's
			// message says which file and why.
			return fmt.Errorf("start container %s: %w: %w; %s", shortID(h.id), sandbox.ErrImageUnusable, err, imageNeeds)
		}
		return fmt.Errorf("start container %s: %w", shortID(h.id), err)
	}
	h.started = time.Now()
	go h.memory.watch(h.id, h.exited)
	return nil
}

// pump demultiplexes the attach stream into the Streams writers until EOF.
func (h *handle) pump() {
	defer close(h.pumpDone)
	_, err := stdcopy.StdCopy(h.stdout, h.stderr, &stampReader{r: h.attach.Reader, last: &h.lastIO})
	h.pumpErr = err
}

// watch records the container's exit. A wait request that breaks (for
// example a dropped connection) is re-issued with the not-running condition,
// which also covers an exit that happened in between.
func (h *handle) watch(waitC <-chan container.WaitResponse, errC <-chan error) {
	defer close(h.exited)
	for attempt := 0; ; attempt++ {
		select {
		case r := <-waitC:
			h.exitCode = r.StatusCode
			if r.Error != nil && r.Error.Message != "" {
				h.waitErr = fmt.Errorf("wait for container %s: %s", shortID(h.id), r.Error.Message)
			}
			return
		case err := <-errC:
			if h.runCtx.Err() != nil || attempt >= waitRetries || isNotFound(err) {
				h.waitErr = fmt.Errorf("wait for container %s: %w", shortID(h.id), err)
				return
			}
			h.b.log.Warn("container wait broke; retrying", "container", shortID(h.id), "err", err)
			time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
			waitC, errC = h.b.api.ContainerWait(h.runCtx, h.id, container.WaitConditionNotRunning)
		}
	}
}

// ID is the container ID.
func (h *handle) ID() string { return h.id }

// Posture reads the live container's confinement from `docker inspect`.
func (h *handle) Posture(ctx context.Context) (sandbox.Posture, error) {
	info, _, err := h.b.api.ContainerInspectWithRaw(ctx, h.id, false)
	if err != nil {
		return sandbox.Posture{}, fmt.Errorf("inspect container %s: %w", shortID(h.id), err)
	}
	return PostureFromInspect(info)
}

// Wait blocks until the container exits, the Spec's timeout passes or ctx is
// cancelled, stops the container in the latter two cases, drains both streams
// and reports the container's final state. Later calls return the same Result.
func (h *handle) Wait(ctx context.Context) sandbox.Result {
	return h.waiter.Wait(ctx, sandbox.WaitSteps{
		Exited:  h.exited,
		Started: h.started,
		Timeout: h.spec.Timeout,
		Stop:    h.stopOrKill,
		Finish: func(ctx context.Context, res *sandbox.Result) {
			res.Err = errors.Join(h.awaitExit(ctx), h.drain(), h.inspectResult(ctx, res))
		},
	})
}

// stopOrKill stops the container, or kills it at once when kill is set.
func (h *handle) stopOrKill(ctx context.Context, kill bool) {
	if kill {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		h.kill(kctx)
		return
	}
	h.stop(ctx)
}

// stop sends SIGTERM, and SIGKILL after the grace period (the engine does this
// in ContainerStop); when the stop request itself fails it kills directly.
func (h *handle) stop(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.spec.StopGrace+cleanupTimeout)
	defer cancel()
	secs := graceSeconds(h.spec.StopGrace)
	err := h.b.api.ContainerStop(ctx, h.id, container.StopOptions{Timeout: &secs})
	if err == nil || isNotFound(err) {
		return
	}
	h.b.log.Warn("container stop failed; killing", "container", shortID(h.id), "err", err)
	h.kill(ctx)
}

// kill sends SIGKILL.
func (h *handle) kill(ctx context.Context) {
	if err := h.b.api.ContainerKill(ctx, h.id, "KILL"); err != nil && !isNotFound(err) {
		h.b.log.Warn("container kill failed", "container", shortID(h.id), "err", err)
	}
}

// awaitExit waits for the exit to be observed, killing the container if it
// outlives a stop by cleanupTimeout.
func (h *handle) awaitExit(ctx context.Context) error {
	for _, killFirst := range []bool{false, true} {
		if killFirst {
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			h.kill(kctx)
			cancel()
		}
		select {
		case <-h.exited:
			return h.waitErr
		case <-time.After(cleanupTimeout):
		}
	}
	return fmt.Errorf("container %s did not exit after SIGKILL", shortID(h.id))
}

// drain waits until both streams reached EOF and everything read was written.
// If the stream stays open and silent for the drain idle period after the
// exit, it is closed and ErrStreamStuck returned.
func (h *handle) drain() error {
	h.lastIO.Store(time.Now().UnixNano())
	tick := time.NewTicker(min(time.Second, h.b.drainIdle/4+time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-h.pumpDone:
			return errors.Join(h.streamErr(), h.stdout.Err(), h.stderr.Err())
		case <-tick.C:
			if time.Since(time.Unix(0, h.lastIO.Load())) > h.b.drainIdle {
				h.attach.Close()
				<-h.pumpDone
				return fmt.Errorf("container %s: %w", shortID(h.id), ErrStreamStuck)
			}
		}
	}
}

// streamErr is the demultiplexer's error, if any.
func (h *handle) streamErr() error {
	if h.pumpErr == nil {
		return nil
	}
	return fmt.Errorf("read output of container %s: %w", shortID(h.id), h.pumpErr)
}

// oomInferred reports an OOM kill the engine missed: the memory cgroup hit
// its limit and the container died of SIGKILL (exit 137) that the backend did
// not send (see oom.go).
func oomInferred(res *sandbox.Result, hitLimit bool) bool {
	return hitLimit && res.ExitCode == 137 && !res.TimedOut && !res.Cancelled
}

// inspectResult fills the exit code, OOM flag and times from the container's
// state. On cgroup v1 the engine sets OOMKilled from the memory cgroup's OOM
// event for the container. On cgroup v2 it depends on memory.events oom_kill
// being attributed to the container's cgroup, which has been unreliable
// (nomad #13119); an exit status of 137 near the memory limit then hints at an
// OOM kill, but only what the engine observed is reported here.
func (h *handle) inspectResult(ctx context.Context, res *sandbox.Result) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	info, _, err := h.b.api.ContainerInspectWithRaw(ctx, h.id, false)
	if err != nil {
		if h.waitErr == nil {
			res.ExitCode = int(h.exitCode)
		}
		return fmt.Errorf("inspect container %s after exit: %w", shortID(h.id), err)
	}
	if info.State == nil {
		return fmt.Errorf("inspect container %s after exit: no state", shortID(h.id))
	}
	res.ExitCode = info.State.ExitCode
	res.OOMKilled = info.State.OOMKilled || oomInferred(res, h.memory.hitLimit.Load())
	res.StartedAt = parseTime(info.State.StartedAt)
	res.FinishedAt = parseTime(info.State.FinishedAt)
	// The engine stamps StartedAt when its start call returns and FinishedAt
	// from the runtime's exit event, so a process that exits at once can
	// appear to finish before it started; report a zero duration instead.
	if res.FinishedAt.Before(res.StartedAt) {
		res.FinishedAt = res.StartedAt
	}
	return nil
}

// parseTime parses the engine's RFC 3339 timestamps; the zero time on failure.
func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// Close removes the container (on a context detached from ctx's cancellation)
// and releases the attach connection. It is safe to call more than once.
func (h *handle) Close(ctx context.Context) error {
	h.closeOnce.Do(func() {
		h.b.unregister(h.id)
		h.closeErr = h.b.removeContainer(ctx, h.id)
		h.release()
	})
	return h.closeErr
}

// discard undoes a failed start: it removes the container and releases the
// attach connection.
func (h *handle) discard(ctx context.Context) {
	if err := h.b.removeContainer(ctx, h.id); err != nil {
		h.b.log.Warn("cleanup after failed start", "container", shortID(h.id), "err", err)
	}
	h.release()
}

// release closes the attach connection, ends the wait request and waits for
// the demultiplexer, so no writer is called after it returns.
func (h *handle) release() {
	h.cancelRun()
	if !h.attached {
		return
	}
	h.attach.Close()
	<-h.pumpDone
}

// spoolWriter forwards to a Streams writer, records the time of each write and,
// after the writer's first error, keeps accepting (and dropping) output so the
// container is never blocked by a broken writer. The error is reported by Wait.
type spoolWriter struct {
	w    io.Writer
	last *atomic.Int64
	err  error
}

// newSpoolWriter wraps w; a nil w discards.
func newSpoolWriter(w io.Writer, last *atomic.Int64) *spoolWriter {
	if w == nil {
		w = io.Discard
	}
	return &spoolWriter{w: w, last: last}
}

// Write implements io.Writer.
func (s *spoolWriter) Write(p []byte) (int, error) {
	if s.err == nil {
		if _, err := s.w.Write(p); err != nil {
			s.err = err
		}
	}
	s.last.Store(time.Now().UnixNano())
	return len(p), nil
}

// Err is the writer's first error.
func (s *spoolWriter) Err() error {
	if s.err == nil {
		return nil
	}
	return fmt.Errorf("write container output: %w", s.err)
}

// stampReader records the time of each read that returned data.
type stampReader struct {
	r    io.Reader
	last *atomic.Int64
}

// Read implements io.Reader.
func (s *stampReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.last.Store(time.Now().UnixNano())
	}
	return n, err
}

var _ sandbox.Handle = (*handle)(nil)
