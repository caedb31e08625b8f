package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
)

// Goals of memory checkpoints (E2B's figures: about 1 s to resume, about
// 4 s per GiB to pause; the pause goal is half of that).
const (
	resumeGoal      = time.Second
	pausePerGiBGoal = 2 * time.Second
	// heldMiB is what the paused sandbox holds on its tmpfs (gVisor keeps
	// it in the sandbox's memory), in random bytes so that it does not
	// compress away.
	heldMiB = 256
	// forks is how many sandboxes the fork measurement resumes at once.
	forks = 4
)

// heldScript fills heldMiB of the sandbox's memory, says so, and counts.
var heldScript = fmt.Sprintf(`head -c %d /dev/urandom >/tmp/held; echo ready; i=0; while :; do i=$((i+1)); echo $i; sleep 0.2; done`, heldMiB<<20)

// checkpointBench pauses a gVisor sandbox holding heldMiB into the store,
// resumes it, and resumes forks copies of it at once, each timed to the
// first byte the restored sandbox prints, beside a cold gVisor run's first
// byte. One sample each: a pause moves hundreds of MiB.
func checkpointBench(ctx context.Context, e *env) ([]row, error) {
	pol := sandbox.DefaultPolicy()
	pol.Runtime = sandbox.RuntimeGVisor
	pol.TmpfsSizeBytes = 2 * heldMiB << 20
	pol.MemoryBytes = 4 * heldMiB << 20
	if e.backend.Capabilities().CheckpointsFor(pol.Runtime) != sandbox.CheckpointMemory {
		return []row{{what: "checkpoints", verdict: "skipped: no memory checkpoints on this engine (scripts/test-setup.sh registers the restore runtime)"}}, nil
	}
	dir, err := e.tempDir("checkpoint-")
	if err != nil {
		return nil, err
	}
	spec := sandbox.Spec{Image: e.c.image, Labels: e.labels, Run: model.RunRef{RunID: "bench"},
		Mounts: []sandbox.Mount{{Source: dir, Target: model.ContainerRunDir}}}

	// The cold baseline: a gVisor sandbox's first byte.
	cold := &firstByte{}
	cs := spec
	cs.Cmd = []string{"echo", "x"}
	cold.start = time.Now()
	h, err := e.backend.Start(ctx, cs, pol, sandbox.Streams{Stdout: cold, Stderr: io.Discard})
	if err != nil {
		return nil, fmt.Errorf("cold gVisor run: %w", err)
	}
	h.Wait(ctx)
	if err := h.Close(ctx); err != nil {
		return nil, err
	}
	coldFirst := cold.latency()

	ready := newWatch("ready\n")
	hs := spec
	hs.Cmd = []string{"sh", "-c", heldScript}
	h, err = e.backend.Start(ctx, hs, pol, sandbox.Streams{Stdout: ready, Stderr: io.Discard})
	if err != nil {
		return nil, err
	}
	select {
	case <-ready.seen:
	case <-time.After(5 * time.Minute):
		_ = h.Close(ctx)
		return nil, errors.New("the sandbox did not fill its memory in 5 minutes")
	}
	ref := model.RunRef{UserID: "bench", ConversationID: "c", TaskID: "t", RunID: "paused"}
	start := time.Now()
	m, err := checkpoint.Pause(ctx, e.backend, h, e.store, ref, checkpoint.Manifest{Runtime: pol.Runtime, Policy: &pol}, dir)
	pause := time.Since(start)
	h.Wait(ctx)
	if err := errors.Join(err, h.Close(ctx)); err != nil {
		return nil, err
	}
	pausePerGiB := time.Duration(float64(pause) * 1024 / heldMiB)

	resume, err := e.resumeFirstByte(ctx, spec, pol, ref, m, 1)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	fork, err := e.resumeFirstByte(ctx, spec, pol, ref, m, forks)
	if err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	base := "cold gVisor first byte"
	archive := fmt.Sprintf(", archive %d MiB", m.Size>>20)
	return []row{
		{what: fmt.Sprintf("pause per GiB (Pause of a sandbox holding %d MiB%s, scaled)", heldMiB, archive),
			taskrun: fmtDuration(pausePerGiB), baseline: base + ": " + fmtDuration(coldFirst),
			ratio:  fmt.Sprintf("%.2f×", float64(pausePerGiB)/float64(coldFirst)),
			target: "≤ " + fmtDuration(pausePerGiBGoal), verdict: verdict(pausePerGiB <= pausePerGiBGoal)},
		{what: fmt.Sprintf("resume of a sandbox holding %d MiB (Resume to its first byte)", heldMiB),
			taskrun: fmtDuration(resume), baseline: base + ": " + fmtDuration(coldFirst),
			ratio:  fmt.Sprintf("%.2f×", float64(resume)/float64(coldFirst)),
			target: "≤ " + fmtDuration(resumeGoal), verdict: verdict(resume <= resumeGoal)},
		{what: fmt.Sprintf("fork of %d from one checkpoint (all to their first byte)", forks),
			taskrun: fmtDuration(fork), baseline: base + ": " + fmtDuration(coldFirst),
			ratio: fmt.Sprintf("%.2f×", float64(fork)/float64(coldFirst))},
	}, nil
}

// resumeFirstByte resumes n sandboxes at once from run ref's checkpoint
// and returns the time until each printed its first byte; it removes them.
func (e *env) resumeFirstByte(ctx context.Context, spec sandbox.Spec, pol sandbox.Policy, ref model.RunRef, m checkpoint.Manifest, n int) (time.Duration, error) {
	start := time.Now()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		hs   []sandbox.Handle
		errs []error
	)
	for range n {
		wg.Go(func() {
			work, err := e.tempDir("resume-")
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			w := newWatch("\n")
			h, _, err := checkpoint.Resume(ctx, e.backend, e.store, ref, m, spec, pol, sandbox.Streams{Stdout: w, Stderr: io.Discard}, work, 0)
			if err == nil {
				select {
				case <-w.seen:
				case <-time.After(2 * time.Minute):
					err = errors.New("no output in 2 minutes")
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if h != nil {
				hs = append(hs, h)
			}
			errs = append(errs, err)
		})
	}
	wg.Wait()
	d := time.Since(start)
	for _, h := range hs {
		stop, cancel := context.WithCancel(ctx)
		cancel()
		h.Wait(stop)
		errs = append(errs, h.Close(ctx))
	}
	return d, errors.Join(errs...)
}

// watch is a writer that closes seen once what it was written holds want.
type watch struct {
	want string
	mu   sync.Mutex
	buf  strings.Builder
	once sync.Once
	seen chan struct{}
}

func newWatch(want string) *watch { return &watch{want: want, seen: make(chan struct{})} }

func (w *watch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() < 1<<16 {
		w.buf.Write(p)
	}
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}
