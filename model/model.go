// Package model holds the domain types shared by every part of taskrun: tasks,
// task runs and the status values a run moves through.
package model

// RunStatus is the state of a task run as the control plane records it.
type RunStatus string

// The run statuses. A run executed directly starts RUNNING; a run submitted
// to the control plane starts QUEUED and becomes RUNNING when a worker leases
// it. Every run ends in exactly one of SUCCEEDED, FAILED or CANCELLED. A
// RUNNING run may be PAUSED: its sandbox was checkpointed and stored with
// the run, and the host holds nothing of it; it becomes RUNNING again when
// it is resumed.
const (
	StatusQueued    RunStatus = "QUEUED"
	StatusRunning   RunStatus = "RUNNING"
	StatusSucceeded RunStatus = "SUCCEEDED"
	StatusFailed    RunStatus = "FAILED"
	StatusCancelled RunStatus = "CANCELLED"
	StatusPaused    RunStatus = "PAUSED"
)

// Terminal reports whether s is a final status.
func (s RunStatus) Terminal() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusCancelled:
		return true
	}
	return false
}

// Live reports whether a run in status s is queued or running: neither
// final nor PAUSED (a paused run is not final: it may be resumed, but
// nothing runs it, and its output so far is stored).
func (s RunStatus) Live() bool {
	return s == StatusQueued || s == StatusRunning
}

// Task is one piece of work a user asked an agent to do.
type Task struct {
	// ID identifies the task.
	ID string `json:"id"`
	// UserID owns the task; it is the tenant for isolation and storage.
	UserID string `json:"user_id"`
	// ConversationID groups the user's tasks.
	ConversationID string `json:"conversation_id"`
	// Prompt is the instruction given to the agent.
	Prompt string `json:"prompt"`
	// WorkspaceDir, when set, is a host directory copied into the run's home.
	WorkspaceDir string `json:"workspace_dir,omitempty"`
}

// TaskRun is one execution of an agent on a task.
type TaskRun struct {
	// ID identifies the run.
	ID string `json:"id"`
	// TaskID is the task this run executes.
	TaskID string `json:"task_id"`
	// PreviousRunID, when set, names the run whose session state this run resumes.
	PreviousRunID string `json:"previous_run_id,omitempty"`
	// ParentRunID, when set, names the run this run was forked from: it
	// starts from that run's checkpoint or final state (executor.Host.Fork)
	// as a run of its own.
	ParentRunID string `json:"parent_run_id,omitempty"`
	// Status is the run's last known status.
	Status RunStatus `json:"status"`
}
