package sandbox

import (
	"context"
	"errors"
)

// CheckpointKind says what a checkpoint of a live sandbox keeps.
type CheckpointKind string

// The kinds of checkpoint, from least to most kept.
const (
	// CheckpointNone: the backend cannot checkpoint a live sandbox.
	CheckpointNone CheckpointKind = ""
	// CheckpointFiles: only the files of the run survive; its processes
	// start again from their command.
	CheckpointFiles CheckpointKind = "files"
	// CheckpointMemory: the processes, their memory and open files, and
	// the files the sandbox holds itself (its tmpfs) survive; the restored
	// sandbox goes on where it stopped.
	CheckpointMemory CheckpointKind = "memory"
)

// ErrCheckpointUnsupported means the backend cannot checkpoint (or restore)
// a sandbox of the given runtime.
var ErrCheckpointUnsupported = errors.New("checkpoint not supported")

// CheckpointsFor returns what the backend keeps when it checkpoints a
// sandbox run under runtime (Policy.Runtime): CheckpointNone unless the
// backend states more in Capabilities.Checkpoints.
func (c Capabilities) CheckpointsFor(runtime string) CheckpointKind {
	return c.Checkpoints[runtime]
}

// Checkpointer is implemented by a backend that can checkpoint a live
// sandbox into a directory and create a sandbox restored from one (a Spec
// with RestoreFrom set). What a checkpoint keeps is stated per runtime in
// Capabilities.Checkpoints.
type Checkpointer interface {
	// Checkpoint writes the state of the live sandbox h into dir, an
	// existing empty directory, and stops the sandbox: h's Wait then
	// returns, with all output up to the checkpoint drained. The error
	// wraps ErrCheckpointUnsupported when the sandbox's runtime cannot be
	// checkpointed.
	Checkpoint(ctx context.Context, h Handle, dir string) error
}
