package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// Errors of pausing and resuming runs, for errors.Is.
var (
	// ErrNotLive means no run with that ID has a live container on this
	// host: it has not started, has ended, or runs elsewhere.
	ErrNotLive = errors.New("no live run with that ID on this host")
	// ErrPaused is what Execute returns for a run that ended PAUSED: not a
	// failure (it does not match ErrRunFailed), not a success either.
	ErrPaused = errors.New("run paused")
)

// liveRuns are the host's runs whose container is live, by run ID: what
// Host.Pause finds.
type liveRuns struct {
	mu   sync.Mutex
	runs map[string]*runner
}

func (l *liveRuns) add(id string, r *runner) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runs == nil {
		l.runs = map[string]*runner{}
	}
	l.runs[id] = r
}

func (l *liveRuns) remove(id string, r *runner) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runs[id] == r {
		delete(l.runs, id)
	}
}

func (l *liveRuns) get(id string) *runner {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs[id]
}

// pausing is a runner's pause: asked once, while its container is live.
type pausing struct {
	mu sync.Mutex
	// h is the live container; nil before it started and once it exited.
	// stop stops it (the run's Stop).
	h    sandbox.Handle
	stop context.CancelFunc
	// asked is set once the sandbox was checkpointed: its exit is the
	// pause, not the agent's end.
	asked bool
	// manifest is the stored checkpoint, as the run's record keeps it;
	// storeErr is why it could not be stored, after the sandbox stopped.
	manifest *checkpoint.Manifest
	storeErr error
	// ended is closed once the run ended; out is its outcome.
	ended chan struct{}
	out   *Outcome
}

// Pause checkpoints the live run runID and ends it PAUSED: its sandbox's
// memory and files are stored as the run's objects checkpoint/* under its
// tenant's prefix (package checkpoint), its outputs are collected and
// stored as for any run's end, and the host lets go of everything it held
// for it (container, uid, disk cap, run directory, gateway, egress proxy).
// It returns once the run ended, with its Outcome, whose Checkpoint is
// the manifest Resume needs. Where the backend keeps no memory of the
// run's runtime (runc without CRIU, Kubernetes), the pause keeps the run's
// files only (sandbox.CheckpointFiles): the container is stopped, its home
// is stored as the run's session state, the reason says so, and a resume
// starts its command again in that home. A checkpoint that fails leaves
// the run going on.
func (h *Host) Pause(ctx context.Context, runID string) (*Outcome, error) {
	r := h.live.get(runID)
	if r == nil {
		return nil, fmt.Errorf("executor: pause run %s: %w", runID, ErrNotLive)
	}
	if err := r.pause(ctx); err != nil {
		return nil, err
	}
	select {
	case <-r.pausing.ended:
		return r.pausing.out, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("executor: pause run %s: the run was checkpointed; waiting for it to end: %w", runID, ctx.Err())
	}
}

// pause checkpoints the run's live sandbox and stores the checkpoint. The
// sandbox stops; the runner's Wait returns and the run ends PAUSED (or
// FAILED when the checkpoint could not be stored: its memory is lost).
func (r *runner) pause(ctx context.Context) error {
	p, pz := r.p, &r.pausing
	pz.mu.Lock()
	defer pz.mu.Unlock()
	if pz.h == nil || pz.asked {
		return fmt.Errorf("executor: pause run %s: %w", p.ref.RunID, ErrNotLive)
	}
	cp, ok := p.in.Sandbox.(sandbox.Checkpointer)
	kind := p.caps.CheckpointsFor(p.policy.Runtime)
	if !ok {
		kind = sandbox.CheckpointNone
	}
	dir, err := os.MkdirTemp(p.hostDir, "checkpoint-")
	if err != nil {
		return fmt.Errorf("executor: pause run %s: %w", p.ref.RunID, err)
	}
	defer os.RemoveAll(dir)
	r.tr.step("pause:checkpoint")
	stop := p.timings.Start(timings.Checkpoint)
	if kind == sandbox.CheckpointNone {
		// No memory checkpoint here: the container is stopped, and the
		// run's files (its home, stored as its session state) are what
		// the checkpoint keeps; a resume starts its command again.
		kind = sandbox.CheckpointFiles
		pz.stop()
		p.log.Warn("the backend keeps no memory of this runtime: the pause keeps the run's files only", "runtime", p.policy.Runtime, "backend", p.caps.Kind)
	} else {
		err = cp.Checkpoint(ctx, pz.h, dir)
	}
	stop()
	if err != nil {
		// The sandbox was not stopped: the run goes on.
		return fmt.Errorf("executor: pause run %s: %w", p.ref.RunID, err)
	}
	pz.asked = true
	pol := r.wd.policy(p)
	m := checkpoint.Manifest{Kind: kind, Runtime: p.policy.Runtime, ImageDigest: p.image.Digest(), Policy: &pol}
	r.tr.step("pause:store")
	stop = p.timings.Start(timings.CheckpointStore)
	m, err = checkpoint.Save(ctx, p.in.Persist, p.ref, dir, m)
	stop()
	if err != nil {
		pz.storeErr = err
		return fmt.Errorf("executor: pause run %s: the sandbox stopped, but its checkpoint was not stored: %w", p.ref.RunID, err)
	}
	pz.manifest = &m
	return nil
}

// started registers the run's live container h: Host.Pause may pause it
// until it exited (exited).
func (r *runner) started(h sandbox.Handle, stop context.CancelFunc) {
	r.pausing.mu.Lock()
	r.pausing.h, r.pausing.stop = h, stop
	r.pausing.mu.Unlock()
	r.p.in.live.add(r.p.ref.RunID, r)
}

// containerExited unregisters the run's container: it cannot be paused
// any more. It waits for a pause under way.
func (r *runner) containerExited() {
	r.p.in.live.remove(r.p.ref.RunID, r)
	r.pausing.mu.Lock()
	r.pausing.h = nil
	r.pausing.mu.Unlock()
}

// pauseVerdict turns the verdict of a paused run into PAUSED: the
// sandbox's exit was its checkpoint. A checkpoint that could not be stored
// fails the run, since the sandbox's memory is lost.
func (r *runner) pauseVerdict(v *verdict, ex *execution) {
	pz := &r.pausing
	pz.mu.Lock()
	defer pz.mu.Unlock()
	switch {
	case !pz.asked:
	case pz.storeErr != nil:
		v.status, v.reason = model.StatusFailed, joinReasons(v.reason, "paused, but its checkpoint was not stored: "+pz.storeErr.Error())
		v.err = errors.Join(v.err, pz.storeErr)
	case v.err == nil:
		// The record, not the archive, keeps where the output stopped:
		// it was drained once the sandbox stopped.
		pz.manifest.StdoutOffset = fileSize(filepath.Join(r.p.hostDir, stdoutSpoolName))
		pz.manifest.StderrOffset = fileSize(filepath.Join(r.p.hostDir, stderrSpoolName))
		v.status = model.StatusPaused
		v.reason = fmt.Sprintf("paused: its %s checkpoint is stored as %s (%s, %d bytes)", pz.manifest.Kind, checkpoint.ArchiveObject, pz.manifest.Digest, pz.manifest.Size)
		if pz.manifest.Kind == sandbox.CheckpointFiles {
			v.reason += fmt.Sprintf("; this backend keeps no memory of runtime %q: the run's files are kept (its home, as its session state), and a resume starts its command again", pz.manifest.Runtime)
		}
		ex.Checkpoint = pz.manifest
	default:
		v.reason = joinReasons(v.reason, fmt.Sprintf("its checkpoint was stored as %s (%s) when it paused", checkpoint.ArchiveObject, pz.manifest.Digest))
	}
}

// fileSize is the size of the file at path; 0 when it cannot be read.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// Resume restores the run spec names, PAUSED with the checkpoint m (the
// manifest its Outcome or record kept), and runs it on to its end as Run
// does: under the same tenant and run ID, with a fresh uid, run directory,
// gateway and egress proxy, its home restored from the state stored when
// it paused, and its stdout and stderr logs going on from where they
// stopped. Before anything is written or reported, the checkpoint is
// fetched and checked: a changed archive fails with checkpoint.ErrDigest,
// another run's or tenant's with checkpoint.ErrForeign, a policy looser
// than the paused run's with checkpoint.ErrLooserPolicy, and the run stays
// PAUSED.
func (h *Host) Resume(ctx context.Context, spec Spec, m checkpoint.Manifest) (*Outcome, error) {
	if err := h.canRun(); err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	in := h.runInput(spec)
	ref := model.RunRef{UserID: spec.Task.UserID, ConversationID: spec.Task.ConversationID, TaskID: spec.Task.ID, RunID: spec.Run.ID}
	pol := in.Policy
	if pol == (sandbox.Policy{}) {
		pol = sandbox.DefaultPolicy()
	}
	if err := checkRestore(h.cfg.Backend, ref, m, pol); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(h.layout.Root(), "restore-")
	if err != nil {
		return nil, fmt.Errorf("executor: resume run %s: %w", ref.RunID, err)
	}
	defer os.RemoveAll(dir)
	img, err := os.MkdirTemp(dir, "image-")
	if err != nil {
		return nil, fmt.Errorf("executor: resume run %s: %w", ref.RunID, err)
	}
	if _, err := checkpoint.Load(ctx, h.cfg.Store, ref, m, img, dir, maxCheckpointBytes(pol)); err != nil {
		return nil, fmt.Errorf("executor: resume run %s: it stays PAUSED: %w", ref.RunID, err)
	}
	in.restore = &restore{dir: img, manifest: m, from: ref.RunID}
	return execute(ctx, in)
}

// restore is a run restored from its checkpoint (Host.Resume), or a fork
// started from its parent's (Host.Fork).
type restore struct {
	// dir is the checkpoint, unpacked and checked; empty for a fork from a
	// stored home.
	dir      string
	manifest checkpoint.Manifest
	// from is the run whose objects it starts from: the run itself, or a
	// fork's parent.
	from string
	// fork is set for a run forked from another (from).
	fork bool
	// stateObject is the object of run from holding the home it starts in
	// (empty: the run's own session state); statePath, when set, is a
	// checked local copy of it.
	stateObject, statePath string
}

// checkRestore refuses, before anything is fetched, a checkpoint the run
// may not be restored from under pol on b.
func checkRestore(b sandbox.Backend, ref model.RunRef, m checkpoint.Manifest, pol sandbox.Policy) error {
	switch {
	case m.Tenant != ref.UserID || m.Run != ref.RunID:
		return fmt.Errorf("executor: resume run %s of tenant %s: it stays PAUSED: %w: the checkpoint names run %q of tenant %q",
			ref.RunID, ref.UserID, checkpoint.ErrForeign, m.Run, m.Tenant)
	case m.Policy == nil:
		return fmt.Errorf("executor: resume run %s: it stays PAUSED: the checkpoint names no policy to restore it under", ref.RunID)
	case m.Runtime != pol.Runtime:
		return fmt.Errorf("executor: resume run %s: it stays PAUSED: it was paused under runtime %q, not %q", ref.RunID, m.Runtime, pol.Runtime)
	}
	if looser := checkpoint.Loosenings(pol, *m.Policy); len(looser) > 0 {
		return fmt.Errorf("executor: resume run %s: it stays PAUSED: %w: %s", ref.RunID, checkpoint.ErrLooserPolicy, strings.Join(looser, "; "))
	}
	if m.Kind == sandbox.CheckpointFiles {
		return nil // the run's files: any backend starts its command again
	}
	if _, ok := b.(sandbox.Checkpointer); !ok || m.Kind != sandbox.CheckpointMemory || sandbox.CapabilitiesOf(b).CheckpointsFor(pol.Runtime) != m.Kind {
		return fmt.Errorf("executor: resume run %s: it stays PAUSED: %w: a %q checkpoint under runtime %q on this backend",
			ref.RunID, sandbox.ErrCheckpointUnsupported, m.Kind, pol.Runtime)
	}
	return nil
}

// maxCheckpointBytes bounds what a checkpoint of a run under pol unpacks
// to: its memory and its /tmp, with room for the sandbox's own state.
func maxCheckpointBytes(pol sandbox.Policy) int64 {
	return 2*(pol.MemoryBytes+pol.TmpfsSizeBytes) + 64<<20
}
