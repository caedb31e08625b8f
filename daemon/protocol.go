// Package daemon is taskrun's resident executor protocol: one process per
// host holding one executor.Host serves local clients over HTTP on a unix
// socket, and `taskrun run` is its thin client.
//
// # Protocol
//
// POST /v1/runs starts a run. The request body is one JSON line (a
// RunRequest), followed, when RunRequest.Workspace is set, by the
// workspace as a workspace.PackHome archive the client packed itself. A
// refused request gets a 4xx status and an ErrorBody. An accepted one gets
// 200 and a stream of JSON lines (Frame): the run's stdout and stderr as
// they come, then one Frame with the Result. A client that disconnects
// cancels its run; POST /v1/runs/{id}/cancel cancels it while the client
// keeps reading the result.
//
// # Trust
//
// The socket is not root-equivalent. Each connection's peer uid is read
// with SO_PEERCRED and mapped to a tenant; a request is the tenant's, and
// is checked as the worker checks a submission: its user is the tenant's,
// its limits within the operator's runlimits.Maxima, its egress granted by
// the operator's egress.Operator, its model scripted or the daemon's own.
// The request carries no host path: the client sends the workspace's bytes,
// so the daemon never reads a file on the client's behalf.
package daemon

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/workerclient"
)

// EnvSocket names the environment variable holding the socket path.
const EnvSocket = "TASKRUN_HOST"

// RootSocket is the socket of a daemon run as root.
const RootSocket = "/run/taskrun/taskrun.sock"

// Paths of the protocol, version 1.
const (
	PathRuns   = "/v1/runs"
	PathCancel = "/v1/runs/{id}/cancel"
	PathExec   = "/v1/runs/{id}/exec"
	// PathPause pauses a live run (executor.Host.Pause) and answers its
	// executor.Outcome, PAUSED, once it ended.
	PathPause = "/v1/runs/{id}/pause"
	// PathResume resumes a run paused through the daemon as a live run
	// again, answering as a detached run's start (Frame).
	PathResume = "/v1/runs/{id}/resume"
	// PathFork starts forks of a live or paused run of the caller's
	// (ForkRequest) as live runs of their own, answering a ForkResult.
	PathFork = "/v1/runs/{id}/fork"
)

// MaxForks bounds the forks one ForkRequest asks for.
const MaxForks = 16

// ForkRequest asks for N forks of a run.
type ForkRequest struct {
	// N is how many forks, 1 to MaxForks.
	N int `json:"n"`
	// Prompt, when set, replaces the parent's prompt in every fork.
	Prompt string `json:"prompt,omitempty"`
}

// ForkResult is the answer to a ForkRequest: one entry per fork asked for.
type ForkResult struct {
	Forks []ForkedRun `json:"forks"`
}

// ForkedRun is one fork: its run ID, and how it ended when it did not
// start (nil Result: it is live).
type ForkedRun struct {
	RunID  string  `json:"run_id"`
	Result *Result `json:"result,omitempty"`
}

// SocketPath is where the daemon listens and the client dials: $TASKRUN_HOST,
// else RootSocket as root, else $XDG_RUNTIME_DIR/taskrun.sock. It is empty
// when none applies (not root and no XDG_RUNTIME_DIR).
func SocketPath() string {
	if p := os.Getenv(EnvSocket); p != "" {
		return p
	}
	if os.Geteuid() == 0 {
		return RootSocket
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "taskrun.sock")
	}
	return ""
}

// ClientSocketPaths are the sockets a client tries, in order:
// $TASKRUN_HOST alone when set; else, as another user than root, its own
// daemon's $XDG_RUNTIME_DIR/taskrun.sock and then the host's RootSocket;
// as root, RootSocket.
func ClientSocketPaths() []string {
	if p := os.Getenv(EnvSocket); p != "" {
		return []string{p}
	}
	var paths []string
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && os.Geteuid() != 0 {
		paths = append(paths, filepath.Join(d, "taskrun.sock"))
	}
	return append(paths, RootSocket)
}

// RunRequest is what a client asks the daemon to run: the run half of
// `taskrun run`'s flags. A zero field takes the daemon's default.
type RunRequest struct {
	// RunID, Conversation, Task, Session, Prompt and ResumeFrom: see
	// taskrun run's flags of those names.
	RunID        string `json:"run_id"`
	Conversation string `json:"conversation"`
	Task         string `json:"task"`
	Session      string `json:"session"`
	Prompt       string `json:"prompt,omitempty"`
	ResumeFrom   string `json:"resume_from,omitempty"`
	// User is the run's user; empty takes the peer's tenant. Only root may
	// name a user other than its tenant.
	User string `json:"user,omitempty"`
	// Image, Command, Entrypoint and Env: see executor.Spec.
	Image      string   `json:"image,omitempty"`
	Command    []string `json:"command,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Env        []string `json:"env,omitempty"`
	// Limits are the tenant's requested limits, within the daemon's maxima
	// (zero fields: the daemon's defaults).
	Limits workerclient.Limits `json:"limits"`
	// Model names a scripted model or the daemon's --model; MaxRequests
	// caps its requests.
	Model       string `json:"model,omitempty"`
	MaxRequests int    `json:"max_requests,omitempty"`
	// Egress is an egress.TenantRequest, granted by the daemon's operator
	// policy; empty: no network.
	Egress json.RawMessage `json:"egress,omitempty"`
	// SessionExcludes, ChangeExcludes and KeepRunDir: see executor.Spec.
	SessionExcludes []string `json:"session_excludes,omitempty"`
	ChangeExcludes  []string `json:"change_excludes,omitempty"`
	KeepRunDir      bool     `json:"keep_run_dir,omitempty"`
	// Workspace says a workspace.PackHome archive follows the JSON line.
	Workspace bool `json:"workspace,omitempty"`
	// KeepAlive asks for a live run: its container idles (the request's
	// command, else an idle loop) until the client cancels it, its idle
	// timeout or its run timeout. The response is one Frame with Started
	// once it runs; its output is not streamed.
	KeepAlive bool `json:"keep_alive,omitempty"`
	// Ports are the TCP ports a live run's agent serves on loopback inside
	// its container (at most MaxPorts, each 1-65535): each is reached only
	// through PathPort with its token (PathPorts), never on the host's
	// network.
	Ports []int `json:"ports,omitempty"`
}

// ExecRequest is a command to run in a live run's container (PathExec).
type ExecRequest struct {
	// Argv is the command; Env adds KEY=VALUE entries; Cwd is its working
	// directory (the run's home when empty).
	Argv []string `json:"argv"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	// Stdin keeps the command's stdin open for PathProcessStdin (else it
	// has none); Tty runs it on a PTY, its output all on stdout.
	Stdin bool `json:"stdin,omitempty"`
	Tty   bool `json:"tty,omitempty"`
}

// ExecResult is how a command in a live run ended.
type ExecResult struct {
	Exit  int    `json:"exit"`
	Error string `json:"error,omitempty"`
}

// Frame is one line of a run's response stream: a chunk of stdout or
// stderr, or the final result.
type Frame struct {
	Stdout []byte  `json:"stdout,omitempty"`
	Stderr []byte  `json:"stderr,omitempty"`
	Result *Result `json:"result,omitempty"`
	// Started says a keep-alive run is running (its RunID).
	Started string `json:"started,omitempty"`
	// Exec ends a command's stream (PathExec, PathProcessOutput).
	Exec *ExecResult `json:"exec,omitempty"`
	// Process names the command a PathExec stream is of (its first frame).
	Process string `json:"process,omitempty"`
	// Offset is where a command's stdout or stderr chunk starts in its
	// output (stdout and stderr together).
	Offset int64 `json:"offset,omitempty"`
}

// Result is how a run ended.
type Result struct {
	// Outcome is the run's outcome; nil when the run never started.
	Outcome *executor.Outcome `json:"outcome,omitempty"`
	// Error is Host.Run's error, empty for a run that succeeded.
	Error string `json:"error,omitempty"`
	// CannotRun says no container ran (taskrun run's exit 125).
	CannotRun bool `json:"cannot_run,omitempty"`
	// User is the user the run ran as (the peer's tenant unless root named
	// another).
	User string `json:"user"`
	// Store is the daemon's store, without credentials.
	Store string `json:"store"`
}

// ErrorBody is the body of a refused request.
type ErrorBody struct {
	Error string `json:"error"`
}

// Errors a client sees.
var (
	// ErrNoDaemon: nothing answers at the socket.
	ErrNoDaemon = errors.New("no taskrun daemon answers at the socket")
	// ErrRefused: the daemon refused the request (RefusedError).
	ErrRefused = errors.New("the taskrun daemon refused the run")
	// ErrDaemonGone: the daemon went away before the run's result.
	ErrDaemonGone = errors.New("the taskrun daemon went away during the run")
)

// RefusedError is a request the daemon refused, with its HTTP status.
type RefusedError struct {
	Status  int
	Message string
}

func (e *RefusedError) Error() string { return e.Message }

// Unwrap makes errors.Is(err, ErrRefused) hold.
func (e *RefusedError) Unwrap() error { return ErrRefused }
