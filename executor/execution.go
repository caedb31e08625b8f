package executor

import (
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/sandbox"
)

// execution is what supervise observed: the container, how it ended and
// what it cost. It is also journaled once the run is judged (the journal
// record's Judged state) for RetryPersist and recovery, hence the JSON
// names.
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
	// Checkpoint is the stored checkpoint of a PAUSED run.
	Checkpoint *checkpoint.Manifest `json:"checkpoint,omitempty"`
	// isolation is the isolation record (audit.json); nil when no
	// container was inspected.
	isolation *audit.Record
}

// apply takes what the Exited hooks reported: the isolation record gets
// the egress hook's part.
func (ex *execution) apply(resp *exitedResponse) {
	ex.PromptTokens, ex.CompletionTokens, ex.ModelUpstream = resp.PromptTokens, resp.CompletionTokens, resp.ModelUpstream
	ex.ReadOnlyRootWrite, ex.StreamEnded, ex.DroppedOutputBytes = resp.ReadOnlyRootWrite, resp.StreamEnded, resp.DroppedOutputBytes
	ex.Usage = resp.Usage
	if resp.Isolation != nil {
		rec := *resp.Isolation
		rec.Egress = resp.Egress
		ex.isolation = &rec
	}
}
