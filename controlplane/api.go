package controlplane

import (
	"encoding/json"
	"time"

	"github.com/taskrun/taskrun/workerclient"
)

// The user API's wire types (docs/control-plane-api.md, "User API"), shared
// by controlplane/server and controlplane/client.

// SubmitRequest is the JSON description of a task: the "task" part of
// POST /v1/tasks (multipart/form-data, with an optional "workspace" part
// holding a gzip'd tar), or the whole body as application/json.
type SubmitRequest struct {
	// Prompt is the instruction given to the agent (required).
	Prompt string `json:"prompt"`
	// ConversationID groups the user's tasks (default "api"); SessionID names
	// the agent session (default: the task ID); PreviousRunID names a run of
	// the same user whose session state the run resumes.
	ConversationID string `json:"conversation_id,omitempty"`
	SessionID      string `json:"session_id,omitempty"`
	PreviousRunID  string `json:"previous_run_id,omitempty"`
	// Model, Image, Runtime, Command, Env, Limits and Egress are passed to the
	// worker (see workerclient.Assignment). They are the tenant's request:
	// Limits must be within the operator's maxima (runlimits.Maxima) and
	// Egress is an egress.TenantRequest, granted by the worker's operator
	// policy (docs/architecture.md, "Trust boundary").
	Model   string              `json:"model,omitempty"`
	Image   string              `json:"image,omitempty"`
	Runtime string              `json:"runtime,omitempty"`
	Command []string            `json:"command,omitempty"`
	Env     []string            `json:"env,omitempty"`
	Limits  workerclient.Limits `json:"limits"`
	Egress  json.RawMessage     `json:"egress,omitempty"`
	// Retryable allows executing the task again when its worker is lost
	// (agents have side effects: only set it for tasks that tolerate that).
	Retryable bool `json:"retryable,omitempty"`
	// KeepAlive asks for a live run: its container idles (Command, else an
	// idle loop) and stays RUNNING until cancelled, its run timeout, or no
	// call on its live API for IdleTimeoutMillis (zero, or more than the
	// worker's operator allows: the worker's bound). The live API
	// (processes, files, ports, usage) is served on /v1/runs/{id}/...
	KeepAlive         bool  `json:"keep_alive,omitempty"`
	IdleTimeoutMillis int64 `json:"idle_timeout_ms,omitempty"`
	// Ports are TCP ports a live run's agent serves inside its container,
	// each reached only through the control plane with its token.
	Ports []int `json:"ports,omitempty"`
}

// SubmitResponse answers POST /v1/tasks (201).
type SubmitResponse struct {
	TaskID string `json:"task_id"`
	RunID  string `json:"run_id"`
	Status string `json:"status"`
	// Workspace is where the uploaded workspace was stored, if any.
	Workspace *workerclient.StoredObject `json:"workspace,omitempty"`
}

// MaxForks bounds the forks one ForkRequest asks for.
const MaxForks = 16

// ForkRequest is the body of POST /v1/runs/{id}/fork: N forks (1 to
// MaxForks) of a PAUSED or ended run, each with Prompt as its prompt when
// not empty (else the parent's).
type ForkRequest struct {
	N      int    `json:"n"`
	Prompt string `json:"prompt,omitempty"`
}

// ForkResponse answers POST /v1/runs/{id}/fork (201): the forks, QUEUED.
type ForkResponse struct {
	Runs []Run `json:"runs"`
}

// RunList answers GET /v1/runs: runs, newest first, without their output
// and prompt (GET /v1/runs/{id} has them).
type RunList struct {
	Runs []Run `json:"runs"`
}

// WorkerList answers GET /v1/workers: the workers heard from within
// WorkerListWindow, most recently seen first.
type WorkerList struct {
	Workers []Worker `json:"workers"`
}

// WorkerListWindow is how far back GET /v1/workers looks: a worker silent
// for longer is gone from the list.
const WorkerListWindow = 24 * time.Hour

// HeaderOutputOffset is set on GET /v1/runs/{id}/output answers: the stream
// offset of the answer's first byte.
const HeaderOutputOffset = "X-Taskrun-Offset"
