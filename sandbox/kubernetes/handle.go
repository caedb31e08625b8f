package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/taskrun/taskrun/helpers/podhelper"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/sandbox"
)

// pollInterval is how often the Pod's status is read while waiting.
const pollInterval = 200 * time.Millisecond

// ErrPodFailed is wrapped when the Pod could not run the command: the fill
// failed, an image is missing, the Pod was evicted or refused.
var ErrPodFailed = errors.New("run pod failed")

// ErrOutputIncomplete is wrapped in a Result's Err when the run container
// exited before the executor acknowledged all of its output (the executor
// took in nothing for podhelper.DefaultAckIdle): the tail may be missing.
var ErrOutputIncomplete = errors.New("run output may be incomplete")

// ErrEvicted is wrapped when the kubelet evicted the run's Pod, as it does
// when the run writes past its disk cap (the data volume's size limit or the
// Pod's ephemeral storage): the Pod's volumes, and the files the run wrote
// into its mounts, go with it.
var ErrEvicted = errors.New("run pod evicted")

// errFillEnded is what a fill stream writer sees when the attach session to
// the fill container ended before it read the whole stream.
var errFillEnded = errors.New("the fill container's session ended")

// handle is one run's Pod.
type handle struct {
	b       *Backend
	name    string
	spec    sandbox.Spec
	streams sandbox.Streams
	stdout  *keepWriter
	stderr  *keepWriter
	started time.Time

	// runCtx scopes the attach session and lives until Close.
	runCtx    context.Context
	cancelRun context.CancelFunc
	gate      *io.PipeWriter
	// stderrFilter removes the gate's tokens from the run's stderr.
	stderrFilter *podhelper.GateFilter
	// acker counts the output received and acknowledges it to the gate,
	// which holds the container's exit until every byte is acknowledged.
	acker   *podhelper.Acker
	ackDone chan struct{}
	// leaseDone is closed once the Lease's renewals ended (runCtx).
	leaseDone chan struct{}
	attached  bool
	pumpDone  chan struct{}
	pumpErr   error

	waiter    sandbox.Waiter
	closeOnce sync.Once
	closeErr  error
}

// newHandle prepares a handle for a Pod about to be created.
func newHandle(b *Backend, name string, spec sandbox.Spec, streams sandbox.Streams) *handle {
	runCtx, cancel := context.WithCancel(context.Background())
	if streams.Stdout == nil {
		streams.Stdout = io.Discard
	}
	if streams.Stderr == nil {
		streams.Stderr = io.Discard
	}
	stdout, stderr := &keepWriter{w: streams.Stdout}, &keepWriter{w: streams.Stderr}
	return &handle{b: b, name: name, spec: spec, streams: sandbox.Streams{Stdout: stdout, Stderr: stderr},
		stdout: stdout, stderr: stderr, runCtx: runCtx, cancelRun: cancel, pumpDone: make(chan struct{})}
}

// start creates the run's Lease, the Pod it owns and the NetworkPolicy the Pod owns, fills the mounts, attaches
// to the run container and releases the gate, in that order.
func (h *handle) start(ctx context.Context, cv converted, sockets []podSocket) error {
	ctx, cancel := context.WithTimeout(ctx, h.b.startTimeout)
	defer cancel()
	ns := h.b.namespace
	// The Lease first: the Pod names it as its owner, so once the Lease is
	// deleted (by this executor, or by any reaper after it expired) the
	// cluster's garbage collector deletes the Pod. This executor renews it
	// while it holds the run.
	var lease *coordinationv1.Lease
	if err := h.b.createRetried(ctx, "create lease "+h.name, func(ctx context.Context) error {
		var err error
		lease, err = h.b.client.leases(ns).Create(ctx, cv.Lease)
		return err
	}); err != nil {
		return fmt.Errorf("create lease %s in namespace %s: %w", h.name, ns, err)
	}
	if lease == nil || lease.UID == "" {
		// The create's answer was lost and a retry was told the Lease exists.
		if err := h.b.retryAPI(ctx, "get lease "+h.name, func(ctx context.Context) error {
			var err error
			lease, err = h.b.client.leases(ns).Get(ctx, h.name)
			return err
		}); err != nil {
			return fmt.Errorf("lease %s: %w", h.name, err)
		}
	}
	h.leaseDone = make(chan struct{})
	go func() {
		defer close(h.leaseDone)
		h.b.renewLease(h.runCtx, h.name)
	}()
	// Then the Pod: the NetworkPolicy names it as its owner, so the
	// cluster's garbage collector deletes the policy with the Pod, whoever
	// deletes the Pod. The command cannot run before the policy exists: the
	// fill container waits for the mounts and the gate for its release,
	// both sent only after the policy is created.
	pod := cv.Pod.DeepCopy()
	pod.OwnerReferences = []metav1.OwnerReference{ownedByLease(lease)}
	var created *corev1.Pod
	if err := h.b.createRetried(ctx, "create pod "+h.name, func(ctx context.Context) error {
		var err error
		created, err = h.b.client.pods(ns).Create(ctx, pod)
		return err
	}); err != nil {
		return fmt.Errorf("create pod %s in namespace %s: %w", h.name, ns, err)
	}
	if created == nil || created.UID == "" {
		// The create's answer was lost and a retry was told the Pod exists.
		var err error
		if created, err = h.b.getPod(ctx, h.name); err != nil {
			return fmt.Errorf("pod %s: %w", h.name, err)
		}
	}
	np := cv.NetworkPolicy.DeepCopy()
	np.OwnerReferences = []metav1.OwnerReference{ownedBy(created)}
	if err := h.b.createRetried(ctx, "create network policy "+h.name, func(ctx context.Context) error {
		_, err := h.b.client.networkPolicies(ns).Create(ctx, np)
		return err
	}); err != nil {
		return fmt.Errorf("create network policy %s: %w", h.name, err)
	}
	if err := h.waitRunning(ctx, ContainerFill); err != nil {
		return err
	}
	if err := h.fill(ctx); err != nil {
		return err
	}
	if err := h.waitRunning(ctx, ContainerRun); err != nil {
		return err
	}
	if len(sockets) > 0 {
		if err := h.waitRunning(ctx, ContainerKeep); err != nil {
			return err
		}
		if err := h.startTunnels(ctx, sockets); err != nil {
			return err
		}
	}
	pr, pw := io.Pipe()
	h.gate = pw
	h.attached = true
	h.acker = podhelper.NewAcker()
	// The gate repeats its token on stderr until released: the first token
	// that arrives proves the session receives stderr and stdout (attached
	// first), so the command, started only now, loses no byte.
	announced := make(chan struct{})
	h.stderrFilter = podhelper.NewGateFilter(h.acker.Stderr(h.streams.Stderr), func() { close(announced) })
	go h.pump(pr)
	select {
	case <-announced:
	case <-h.pumpDone:
		return fmt.Errorf("attach to pod %s: %w", h.name, h.pumpErr)
	case <-ctx.Done():
		return fmt.Errorf("attach to pod %s: %w", h.name, context.Cause(ctx))
	}
	released := make(chan error, 1)
	go func() { _, err := pw.Write([]byte{'g'}); released <- err }()
	select {
	case err := <-released:
		if err != nil {
			return fmt.Errorf("release the gate of pod %s: %w", h.name, err)
		}
	case <-h.pumpDone:
		return fmt.Errorf("attach to pod %s: %w", h.name, h.pumpErr)
	case <-ctx.Done():
		return fmt.Errorf("attach to pod %s: %w", h.name, context.Cause(ctx))
	}
	h.started = time.Now()
	// From now on the gate's stdin carries the acknowledgements; they end
	// with the attach session (pump closes the pipe's reader).
	h.ackDone = make(chan struct{})
	go func() {
		defer close(h.ackDone)
		if err := h.acker.Run(h.runCtx, pw, 0); err != nil {
			h.b.log.Debug("acknowledgements ended", "pod", h.name, "err", err)
		}
	}()
	return nil
}

// pump attaches to the run container until it exits. The gate exits only
// once the acknowledgements cover every byte it forwarded, so the session
// ends with the output delivered.
func (h *handle) pump(stdin io.Reader) {
	defer close(h.pumpDone)
	err := h.b.attach(h.runCtx, h.name, ContainerRun, streamIO{Stdin: stdin, Stdout: h.acker.Stdout(h.streams.Stdout), Stderr: h.stderrFilter})
	// Acknowledgements written from now on fail; the session's stdin copy,
	// which may outlive the session, sees a clean end.
	h.gate.Close()
	h.pumpErr = errors.Join(err, h.stderrFilter.Flush())
}

// fill sends the Spec's mounts to the fill container and waits for it to
// finish.
func (h *handle) fill(ctx context.Context) error {
	pr, pw := io.Pipe()
	var out lockedbuf.Buffer
	done := make(chan error, 1)
	go func() {
		err := h.b.attach(ctx, h.name, ContainerFill, streamIO{Stdin: pr, Stdout: &out, Stderr: &out})
		// A session that ended before reading everything fails the writer
		// instead of blocking it.
		pr.CloseWithError(errors.Join(err, errFillEnded))
		done <- err
	}()
	werr := writeFillStream(ctx, pw, h.spec.Mounts)
	pw.CloseWithError(werr)
	if werr != nil {
		return fmt.Errorf("send mounts to pod %s: %w (%s)", h.name, werr, bytes.TrimSpace([]byte(out.String())))
	}
	defer func() {
		select {
		case <-done:
		case <-time.After(cleanupTimeout):
		}
	}()
	for {
		pod, err := h.b.getPod(ctx, h.name)
		if err != nil {
			return fmt.Errorf("pod %s: %w", h.name, err)
		}
		if st := containerStatus(pod, ContainerFill); st != nil && st.State.Terminated != nil {
			if t := st.State.Terminated; t.ExitCode != 0 {
				return fmt.Errorf("%w: pod %s: receiving the mounts failed (exit %d): %s%s", ErrPodFailed, h.name, t.ExitCode, t.Message, bytes.TrimSpace([]byte(out.String())))
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s: fill: %w", h.name, context.Cause(ctx))
		case <-time.After(pollInterval):
		}
	}
}

// waitRunning waits until the named container runs (or, for the run
// container, already ran), failing early on what cannot recover.
func (h *handle) waitRunning(ctx context.Context, container string) error {
	for {
		pod, err := h.b.getPod(ctx, h.name)
		if err != nil {
			return fmt.Errorf("pod %s: %w", h.name, err)
		}
		if pod.Status.Phase == corev1.PodFailed {
			return fmt.Errorf("%w: pod %s: %s %s", ErrPodFailed, h.name, pod.Status.Reason, pod.Status.Message)
		}
		if st := containerStatus(pod, container); st != nil {
			switch {
			case st.State.Running != nil, st.State.Terminated != nil:
				return nil
			case st.State.Waiting != nil:
				if err := waitingError(pod, st); err != nil {
					return err
				}
			}
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				h.b.log.Debug("pod unschedulable; waiting", "pod", h.name, "message", c.Message)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s: container %s did not start: %w", h.name, container, context.Cause(ctx))
		case <-time.After(pollInterval):
		}
	}
}

// waitingError explains a container waiting for something that will not
// come: a missing image (never pulled) or a bad container configuration.
func waitingError(pod *corev1.Pod, st *corev1.ContainerStatus) error {
	w := st.State.Waiting
	switch w.Reason {
	case "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName":
		return fmt.Errorf("create pod %s: %w: %q on the cluster's nodes (%s: %s); load it into the nodes' containerd; images are never pulled",
			pod.Name, sandbox.ErrImageNotFound, st.Image, w.Reason, w.Message)
	case "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff":
		return fmt.Errorf("%w: pod %s: container %s: %s: %s", ErrPodFailed, pod.Name, st.Name, w.Reason, w.Message)
	}
	return nil
}

// ID is the Pod's name.
func (h *handle) ID() string { return h.name }

// Posture reads the live Pod's confinement from its spec and status, and
// its NetworkPolicy.
func (h *handle) Posture(ctx context.Context) (sandbox.Posture, error) {
	pod, err := h.b.getPod(ctx, h.name)
	if err != nil {
		return sandbox.Posture{}, fmt.Errorf("get pod %s: %w", h.name, err)
	}
	return podPosture(ctx, h.b.client, pod)
}

// Wait blocks until the run container exits, the Spec's timeout passes or
// ctx is cancelled, stops it in the latter two cases, drains its output,
// copies the read-write mounts back and reports how it ended.
func (h *handle) Wait(ctx context.Context) sandbox.Result {
	return h.waiter.Wait(ctx, sandbox.WaitSteps{
		Exited:  h.pumpDone, // the attach session ends when the run container exits
		Started: h.started,
		Timeout: h.spec.Timeout,
		Stop:    h.stop,
		Finish:  h.finish,
	})
}

// finish waits for the run container to terminate and its output to end,
// copies the read-write mounts back and fills in res.
func (h *handle) finish(ctx context.Context, res *sandbox.Result) {
	// The budget covers an API server outage (retryAPI) on top of the
	// stop and the copy-out.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.spec.StopGrace+2*cleanupTimeout+h.b.apiOutage)
	defer cancel()
	var errs []error
	term, err := h.awaitTerminated(dctx)
	errs = append(errs, err)
	select {
	case <-h.pumpDone:
		if h.pumpErr != nil {
			errs = append(errs, fmt.Errorf("read output of pod %s: %w", h.name, h.pumpErr))
		}
	case <-dctx.Done():
		errs = append(errs, fmt.Errorf("pod %s: output stream did not close after the container exited", h.name))
	}
	if term != nil {
		res.ExitCode = int(term.ExitCode)
		res.OOMKilled = term.Reason == "OOMKilled"
		res.StartedAt = term.StartedAt.Time
		res.FinishedAt = term.FinishedAt.Time
		if res.FinishedAt.Before(res.StartedAt) {
			res.FinishedAt = res.StartedAt
		}
		if why, ok := strings.CutPrefix(term.Message, podhelper.UnacknowledgedPrefix); ok {
			errs = append(errs, fmt.Errorf("%w: pod %s: %s", ErrOutputIncomplete, h.name, why))
		}
	}
	errs = append(errs, h.stdout.Err(), h.stderr.Err())
	if err := h.evicted(dctx); err != nil {
		errs = append(errs, err) // the volumes are gone: nothing to copy out
	} else {
		errs = append(errs, h.copyOut(dctx))
	}
	res.Err = errors.Join(errs...)
}

// evicted returns an error wrapping ErrEvicted, with the kubelet's reason,
// when the Pod was evicted; nil otherwise, also when the Pod cannot be read
// (the copy-out then reports what went wrong).
func (h *handle) evicted(ctx context.Context) error {
	pod, err := h.b.getPod(ctx, h.name)
	if err != nil || pod.Status.Reason != "Evicted" {
		return nil
	}
	return fmt.Errorf("%w: pod %s: %s (the run's disk cap is %d bytes; the files in its mounts were lost with the pod)",
		ErrEvicted, h.name, strings.TrimSpace(pod.Status.Message), h.b.dataVolumeBytes(h.spec))
}

// stop runs the helper's stop in the run container: SIGTERM, then SIGKILL
// after the grace period (SIGKILL alone when kill is set). The exec ends
// with the container, so its error is expected and only logged.
func (h *handle) stop(ctx context.Context, kill bool) {
	grace := h.spec.StopGrace
	if kill {
		grace = 0 // SIGKILL at once
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+cleanupTimeout)
	defer cancel()
	var out bytes.Buffer
	if err := h.b.exec(ctx, h.name, ContainerRun, podhelper.StopCommand(grace), streamIO{Stdout: &out, Stderr: &out}); err != nil {
		h.b.log.Debug("stop exec ended", "pod", h.name, "err", err, "output", out.String())
	}
}

// awaitTerminated polls the Pod until the run container has terminated.
func (h *handle) awaitTerminated(ctx context.Context) (*corev1.ContainerStateTerminated, error) {
	for {
		pod, err := h.b.getPod(ctx, h.name)
		if err != nil {
			return nil, fmt.Errorf("pod %s after exit: %w", h.name, err)
		}
		if st := containerStatus(pod, ContainerRun); st != nil && st.State.Terminated != nil {
			return st.State.Terminated, nil
		}
		if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
			return nil, fmt.Errorf("%w: pod %s ended (%s) without the run container's exit status: %s", ErrPodFailed, h.name, pod.Status.Reason, pod.Status.Message)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pod %s: run container did not exit: %w", h.name, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// copyOut copies every read-write directory mount back from the keeper.
func (h *handle) copyOut(ctx context.Context) error {
	var errs []error
	for i, m := range h.spec.Mounts {
		if m.ReadOnly {
			continue
		}
		if info, err := os.Stat(m.Source); err != nil || !info.IsDir() {
			continue
		}
		if err := h.copyMountOut(ctx, i, m.Source); err != nil {
			errs = append(errs, fmt.Errorf("copy %s out of pod %s: %w", m.Target, h.name, err))
		}
	}
	return errors.Join(errs...)
}

// copyMountOut streams mount i's archive from the keeper into its host
// directory.
func (h *handle) copyMountOut(ctx context.Context, i int, source string) error {
	pr, pw := io.Pipe()
	var stderr lockedbuf.Buffer
	go func() {
		err := h.b.exec(ctx, h.name, ContainerKeep, podhelper.PackCommand(i), streamIO{Stdout: pw, Stderr: &stderr})
		if err != nil && stderr.String() != "" {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace([]byte(stderr.String())))
		}
		pw.CloseWithError(err)
	}()
	err := syncInto(ctx, pr, source, h.b.dataVolumeBytes(h.spec))
	pr.CloseWithError(err)
	return err
}

// Close deletes the Pod and its NetworkPolicy (on a context detached from
// ctx's cancellation) and ends the attach session. It is safe to call more
// than once.
func (h *handle) Close(ctx context.Context) error {
	h.closeOnce.Do(func() {
		h.b.unregister(h.name)
		h.closeErr = h.b.deleteRun(ctx, h.name)
		h.release()
	})
	return h.closeErr
}

// discard undoes a failed start.
func (h *handle) discard(ctx context.Context) {
	if err := h.b.deleteRun(ctx, h.name); err != nil {
		h.b.log.Warn("cleanup after failed start", "pod", h.name, "err", err)
	}
	h.release()
}

// release ends the attach session and waits for it, so no writer is called
// after it returns.
func (h *handle) release() {
	h.cancelRun()
	if h.gate != nil {
		h.gate.Close()
	}
	if h.attached {
		<-h.pumpDone
	}
	if h.ackDone != nil {
		<-h.ackDone
	}
	if h.leaseDone != nil {
		<-h.leaseDone
	}
}

var _ sandbox.Handle = (*handle)(nil)

// keepWriter forwards to a Streams writer and, after the writer's first
// error, keeps accepting (and dropping) output, so a broken writer never
// breaks the attach session and stalls the container. Wait reports the
// error.
type keepWriter struct {
	w   io.Writer
	mu  sync.Mutex
	err error
}

// Write implements io.Writer.
func (k *keepWriter) Write(p []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err == nil {
		if _, err := k.w.Write(p); err != nil {
			k.err = err
		}
	}
	return len(p), nil
}

// Err is the writer's first error, if any.
func (k *keepWriter) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err == nil {
		return nil
	}
	return fmt.Errorf("write run output: %w", k.err)
}
