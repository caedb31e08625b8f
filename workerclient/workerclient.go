// Package workerclient is the worker's side of the control-plane HTTP API: it
// reports run status and streams run output.
package workerclient

import (
	"context"

	"github.com/taskrun/taskrun/model"
)

// PatchTaskRunRequest is the body of PATCH /v1/task-runs/{id}. Nil fields are
// left unchanged by the server.
type PatchTaskRunRequest struct {
	Status           model.RunStatus `json:"status"`
	StartedAt        *int64          `json:"started_at,omitempty"` // unix milliseconds
	EndedAt          *int64          `json:"ended_at,omitempty"`   // unix milliseconds
	Output           *string         `json:"output,omitempty"`
	OutputTruncated  bool            `json:"output_truncated,omitempty"`
	Error            *string         `json:"error,omitempty"`
	ExitCode         *int            `json:"exit_code,omitempty"`
	PromptTokens     *int            `json:"prompt_tokens,omitempty"`
	CompletionTokens *int            `json:"completion_tokens,omitempty"`
	TracePath        *string         `json:"trace_path,omitempty"`
	Artifact         *Artifact       `json:"artifact,omitempty"`
	Changes          *ChangeSet      `json:"changes,omitempty"`
	Container        *ContainerInfo  `json:"container,omitempty"`
}

// ChangeSet summarises what the run changed in its workspace and names the
// stored patch and change list; the patch itself is never inlined.
type ChangeSet struct {
	// Patch is changes.patch, a git patch against the starting tree.
	Patch Artifact `json:"patch"`
	// List is changes.json, every changed path with sizes and SHA-256.
	List Artifact `json:"list"`
	// TreeHash identifies the final tree; BaseCommit is the git
	// workspace's HEAD at the start, if it was one.
	TreeHash   string `json:"tree_hash"`
	BaseCommit string `json:"base_commit,omitempty"`
	Files      int    `json:"files"`
	Added      int    `json:"added"`
	Deleted    int    `json:"deleted"`
	Modified   int    `json:"modified"`
	Renamed    int    `json:"renamed"`
	// ModeChanged and TypeChanged count paths whose git mode, or whose
	// type (file or symlink), alone changed.
	ModeChanged int `json:"mode_changed"`
	TypeChanged int `json:"type_changed"`
	// Omitted counts changes left out of the patch (over a cap).
	Omitted    int `json:"omitted"`
	Insertions int `json:"insertions"`
	Deletions  int `json:"deletions"`
}

// Artifact describes a stored artifact of the run.
type Artifact struct {
	Key         string `json:"key"`
	Size        int64  `json:"size"`
	SHA256      string `json:"sha256"`
	ContentType string `json:"content_type"`
}

// ContainerInfo records which container ran the run.
type ContainerInfo struct {
	ID string `json:"id"`
	// ImageDigest names the image the container ran: its repo digest
	// (name@sha256:...) when it came from a registry, else its image ID.
	ImageDigest string `json:"image_digest,omitempty"`
	Runtime     string `json:"runtime,omitempty"`
}

// Delta is one chunk of a run's stdout, starting at byte Offset of the stream.
type Delta struct {
	Offset int64  `json:"offset"`
	Data   []byte `json:"data"`
}

// StreamSender receives a run's stdout as ordered deltas. Send is called with
// increasing, contiguous offsets from a single goroutine; End is called once, last,
// with the total byte count.
type StreamSender interface {
	Send(ctx context.Context, taskRunID string, d Delta) error
	End(ctx context.Context, taskRunID string, totalBytes int64) error
}
