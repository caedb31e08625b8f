package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
)

// ErrLooserPolicy means a resume asked for more than the run had when it
// was paused.
var ErrLooserPolicy = errors.New("a restore may not run with more privilege than the run had")

// Loosenings lists, in words, every way pol confines less than was, the
// policy the run had when it was paused. The uid is not compared: a
// resumed run leases a fresh one, and Policy.Validate refuses root.
func Loosenings(pol, was sandbox.Policy) []string {
	var out []string
	add := func(cond bool, format string, args ...any) {
		if cond {
			out = append(out, fmt.Sprintf(format, args...))
		}
	}
	add(was.ReadOnlyRootfs && !pol.ReadOnlyRootfs, "writable root filesystem")
	add(pol.TmpfsSizeBytes > was.TmpfsSizeBytes, "/tmp %d bytes > %d", pol.TmpfsSizeBytes, was.TmpfsSizeBytes)
	add(pol.PidsLimit > was.PidsLimit, "pids limit %d > %d", pol.PidsLimit, was.PidsLimit)
	add(pol.MemoryBytes > was.MemoryBytes, "memory %d bytes > %d", pol.MemoryBytes, was.MemoryBytes)
	add(pol.NanoCPUs > was.NanoCPUs, "cpus %d > %d (billionths)", pol.NanoCPUs, was.NanoCPUs)
	add(pol.NetworkMode != was.NetworkMode, "network %q instead of %q", pol.NetworkMode, was.NetworkMode)
	add(pol.Runtime != was.Runtime, "runtime %q instead of %q", pol.Runtime, was.Runtime)
	add(pol.NoFile > was.NoFile, "nofile %d > %d", pol.NoFile, was.NoFile)
	return out
}

// Pause checkpoints the live sandbox h of run ref on backend b and stores
// the checkpoint as objects of the run (Save). m carries what the caller
// knows of the run (its runtime, policy and image digest); Kind and
// Created are set here. workDir is a host directory for the checkpoint
// while it is packed and stored; it is left as it was. The sandbox is stopped: the caller
// waits for h and closes it. The manifest returned is for the run's
// record, which Resume checks the stored checkpoint against.
func Pause(ctx context.Context, b sandbox.Backend, h sandbox.Handle, st Storage, ref model.RunRef, m Manifest, workDir string) (Manifest, error) {
	cp, ok := b.(sandbox.Checkpointer)
	kind := sandbox.CapabilitiesOf(b).CheckpointsFor(m.Runtime)
	if !ok || kind == sandbox.CheckpointNone {
		return m, fmt.Errorf("checkpoint: pause run %s: %w for runtime %q on this backend", ref.RunID, sandbox.ErrCheckpointUnsupported, m.Runtime)
	}
	if m.Policy == nil {
		return m, fmt.Errorf("checkpoint: pause run %s: the manifest must name the run's policy, which a resume may not loosen", ref.RunID)
	}
	dir, err := os.MkdirTemp(workDir, "checkpoint-")
	if err != nil {
		return m, fmt.Errorf("checkpoint: pause run %s: %w", ref.RunID, err)
	}
	defer os.RemoveAll(dir)
	if err := cp.Checkpoint(ctx, h, dir); err != nil {
		return m, fmt.Errorf("checkpoint: pause run %s: %w", ref.RunID, err)
	}
	m.Kind, m.Created = kind, time.Now().UTC()
	return Save(ctx, st, ref, dir, m)
}

// Resume restores run ref from the checkpoint stored for it: it loads and
// checks it against want, the manifest the run's record kept (Load), into
// a directory under workDir, and starts a sandbox from it on backend b
// with spec and pol, its output going to streams. The policy's runtime must
// be the one the checkpoint was taken under. workDir must outlive the
// sandbox; the caller removes it once the run ended.
func Resume(ctx context.Context, b sandbox.Backend, st Storage, ref model.RunRef, want Manifest, spec sandbox.Spec, pol sandbox.Policy, streams sandbox.Streams, workDir string, maxBytes int64) (sandbox.Handle, Manifest, error) {
	if want.Runtime != pol.Runtime {
		return nil, want, fmt.Errorf("checkpoint: resume run %s: it was paused under runtime %q, not %q", ref.RunID, want.Runtime, pol.Runtime)
	}
	if want.Policy == nil {
		return nil, want, fmt.Errorf("checkpoint: resume run %s: the run's record names no policy to restore it under", ref.RunID)
	}
	if looser := Loosenings(pol, *want.Policy); len(looser) > 0 {
		return nil, want, fmt.Errorf("checkpoint: resume run %s: %w: %s", ref.RunID, ErrLooserPolicy, strings.Join(looser, "; "))
	}
	if sandbox.CapabilitiesOf(b).CheckpointsFor(pol.Runtime) != want.Kind || want.Kind != sandbox.CheckpointMemory {
		return nil, want, fmt.Errorf("checkpoint: resume run %s: %w: a %q checkpoint under runtime %q on this backend", ref.RunID, sandbox.ErrCheckpointUnsupported, want.Kind, pol.Runtime)
	}
	dir, err := os.MkdirTemp(workDir, "restore-")
	if err != nil {
		return nil, want, fmt.Errorf("checkpoint: resume run %s: %w", ref.RunID, err)
	}
	m, err := Load(ctx, st, ref, want, dir, workDir, maxBytes)
	if err != nil {
		return nil, m, err
	}
	spec.RestoreFrom = dir
	h, err := b.Start(ctx, spec, pol, streams)
	if err != nil {
		return nil, m, fmt.Errorf("checkpoint: resume run %s: %w", ref.RunID, err)
	}
	return h, m, nil
}
