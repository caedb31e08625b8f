package docker

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker/runscrestore"
)

// Memory checkpoints of gVisor runs (see docs/checkpoints.md).
const (
	// RestoreRuntime is the engine runtime that restores a gVisor sandbox
	// from a checkpoint: cmd/taskrun-runsc-restore, registered with dockerd
	// by scripts/test-setup.d/40-runsc-restore.
	RestoreRuntime = sandbox.RuntimeGVisorRestore
	// DefaultRunscRoot is runsc's state directory for the containers
	// dockerd's containerd shim creates (its "moby" namespace).
	DefaultRunscRoot = "/run/docker/runtime-runc/moby"
	// checkpointTimeout bounds one `runsc checkpoint`.
	checkpointTimeout = 5 * time.Minute
)

// checkpointRuntimes returns what a checkpoint keeps per runtime: memory for
// gVisor runs when the engine is on this host (a unix socket), has both
// runsc and the restore runtime registered, and runsc's binary is here;
// nothing otherwise. It asks
// the engine once per Backend.
func (b *Backend) checkpointRuntimes() map[string]sandbox.CheckpointKind {
	b.ckOnce.Do(func() {
		if host := b.api.DaemonHost(); !strings.HasPrefix(host, "unix://") {
			// runsc runs here, on the engine's state: a remote engine's
			// sandboxes are not this host's to checkpoint.
			b.log.Debug("no memory checkpoints: the engine is not on this host", "host", host)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
		defer cancel()
		info, err := b.api.Info(ctx)
		if err != nil {
			b.log.Debug("no memory checkpoints: docker info failed", "err", err)
			return
		}
		runsc, ok := info.Runtimes[sandbox.RuntimeGVisor]
		if _, restore := info.Runtimes[RestoreRuntime]; !ok || !restore {
			return
		}
		if _, err := exec.LookPath(runsc.Path); err != nil {
			b.log.Debug("no memory checkpoints: runsc is not on this host", "path", runsc.Path, "err", err)
			return
		}
		b.runsc = runsc.Path
		b.ckKinds = map[string]sandbox.CheckpointKind{sandbox.RuntimeGVisor: sandbox.CheckpointMemory}
	})
	return b.ckKinds
}

// Checkpoint writes a gVisor sandbox's memory, processes and the files it
// holds itself (its root filesystem's tmpfs) into dir with `runsc
// checkpoint`, which stops the sandbox (sandbox.Checkpointer). The run's
// bind-mounted directories are not part of it: the caller keeps those. The
// error wraps sandbox.ErrCheckpointUnsupported for a sandbox not under
// gVisor or an engine without the restore runtime.
func (b *Backend) Checkpoint(ctx context.Context, h sandbox.Handle, dir string) error {
	if b.checkpointRuntimes()[sandbox.RuntimeGVisor] != sandbox.CheckpointMemory {
		return fmt.Errorf("checkpoint %s: %w: the engine needs the runtimes %s and %s registered (scripts/test-setup.sh does it)",
			shortID(h.ID()), sandbox.ErrCheckpointUnsupported, sandbox.RuntimeGVisor, RestoreRuntime)
	}
	info, _, err := b.api.ContainerInspectWithRaw(ctx, h.ID(), false)
	if err != nil {
		return fmt.Errorf("checkpoint %s: inspect: %w", shortID(h.ID()), err)
	}
	if rt := info.HostConfig.Runtime; rt != sandbox.RuntimeGVisor && rt != RestoreRuntime {
		return fmt.Errorf("checkpoint %s: %w for runtime %q: only gVisor (%s) sandboxes keep their memory",
			shortID(h.ID()), sandbox.ErrCheckpointUnsupported, rt, sandbox.RuntimeGVisor)
	}
	if info.State == nil || !info.State.Running {
		return fmt.Errorf("checkpoint %s: the container is not running", shortID(h.ID()))
	}
	ctx, cancel := context.WithTimeout(ctx, checkpointTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.runsc, "--root", b.runscRoot, "checkpoint", "--image-path", dir, info.ID)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("checkpoint %s: runsc checkpoint: %w: %s", shortID(h.ID()), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// restoreSpec prepares the create of a sandbox restored from
// spec.RestoreFrom: the restore runtime, told the checkpoint's directory
// through the container's environment. A Spec that sets that variable
// itself is refused: only RestoreFrom may ask for a restore.
func (b *Backend) restoreSpec(spec sandbox.Spec, pol sandbox.Policy) (sandbox.Spec, sandbox.Policy, error) {
	if slices.ContainsFunc(spec.Env, func(kv string) bool { return strings.HasPrefix(kv, runscrestore.EnvRestoreImage+"=") }) {
		return spec, pol, fmt.Errorf("sandbox spec: the environment variable %s is reserved; set Spec.RestoreFrom to restore a checkpoint", runscrestore.EnvRestoreImage)
	}
	if spec.RestoreFrom == "" {
		return spec, pol, nil
	}
	if pol.Runtime != sandbox.RuntimeGVisor || b.checkpointRuntimes()[pol.Runtime] != sandbox.CheckpointMemory {
		return spec, pol, fmt.Errorf("sandbox spec: restore from %s: %w for runtime %q on this engine (gVisor with the %s runtime registered is needed)",
			spec.RestoreFrom, sandbox.ErrCheckpointUnsupported, pol.Runtime, RestoreRuntime)
	}
	if !isAbs(spec.RestoreFrom) {
		return spec, pol, fmt.Errorf("sandbox spec: restore from %q: the path must be absolute", spec.RestoreFrom)
	}
	if fi, err := os.Stat(spec.RestoreFrom); err != nil || !fi.IsDir() {
		return spec, pol, fmt.Errorf("sandbox spec: restore from %s: not a directory: %w", spec.RestoreFrom, err)
	}
	spec.Env = append(slices.Clone(spec.Env), runscrestore.EnvRestoreImage+"="+spec.RestoreFrom)
	pol.Runtime = RestoreRuntime
	return spec, pol, nil
}

var _ sandbox.Checkpointer = (*Backend)(nil)
