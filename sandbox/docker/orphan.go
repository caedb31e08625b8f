package docker

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/taskrun/taskrun/sandbox"
)

// OrphanState is what the engine knows of a container left behind by an
// executor that is gone.
type OrphanState struct {
	// Exists is false when the container is gone.
	Exists bool
	// Running is true while it runs.
	Running bool
	// ExitCode is its exit status once it stopped.
	ExitCode int
	// OOMKilled is the engine's OOM flag.
	OOMKilled bool
}

// InspectOrphan reports the state of container id.
func (b *Backend) InspectOrphan(ctx context.Context, id string) (OrphanState, error) {
	info, _, err := b.api.ContainerInspectWithRaw(ctx, id, false)
	if isNotFound(err) {
		return OrphanState{}, nil
	}
	if err != nil {
		return OrphanState{}, fmt.Errorf("inspect container %s: %w", shortID(id), err)
	}
	st := OrphanState{Exists: true}
	if info.State != nil {
		st.Running = info.State.Running
		st.ExitCode = info.State.ExitCode
		st.OOMKilled = info.State.OOMKilled
	}
	return st, nil
}

// OrphanExists reports whether container id exists.
func (b *Backend) OrphanExists(ctx context.Context, id string) (bool, error) {
	st, err := b.InspectOrphan(ctx, id)
	return st.Exists, err
}

// StopOrphan stops container id (SIGTERM, SIGKILL after grace) and waits
// until it is no longer running. A container that is gone or stopped is not
// an error.
func (b *Backend) StopOrphan(ctx context.Context, id string, grace time.Duration) error {
	secs := graceSeconds(grace)
	err := b.api.ContainerStop(ctx, id, container.StopOptions{Timeout: &secs})
	if err == nil || isNotFound(err) {
		return nil
	}
	if kerr := b.api.ContainerKill(ctx, id, "KILL"); kerr != nil && !isNotFound(kerr) {
		return fmt.Errorf("stop container %s: %w; kill: %w", shortID(id), err, kerr)
	}
	return nil
}

// OrphanLogs copies everything the engine's json-file log kept of container
// id's stdout and stderr to the writers. The log is capped (Policy.LogMaxSize
// times LogMaxFile): of a container that printed more, only the tail is kept.
// A container that is gone, or that the engine marked dead or for removal
// (it refuses its log with a conflict), is sandbox.ErrContainerGone.
func (b *Backend) OrphanLogs(ctx context.Context, id string, stdout, stderr io.Writer) error {
	rc, err := b.api.ContainerLogs(ctx, id, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if isNotFound(err) || isConflict(err) {
		return fmt.Errorf("logs of container %s: %w: %w", shortID(id), sandbox.ErrContainerGone, err)
	}
	if err != nil {
		return fmt.Errorf("logs of container %s: %w", shortID(id), err)
	}
	defer rc.Close()
	if _, err := stdcopy.StdCopy(stdout, stderr, rc); err != nil {
		return fmt.Errorf("logs of container %s: %w", shortID(id), err)
	}
	return nil
}

// RemoveOrphan force-removes container id; one that is gone is not an error.
func (b *Backend) RemoveOrphan(ctx context.Context, id string) error {
	return b.removeContainer(ctx, id)
}

var _ sandbox.Orphans = (*Backend)(nil)
