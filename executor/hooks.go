package executor

import (
	"context"
	"io"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/records"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workspace"
)

// A run's lifecycle, as the runner (runner.go) walks its hooks:
//
//	Prestart ──► (create point) ──► Prestart ──► Configure ──► start
//	   hooks above the point         hooks below it run while the engine
//	   (uid, empty run dir)          creates the container, when it can
//	                                                              │
//	   Stop ◄── report ◄── Collect ◄── verdict ◄── Exited ◄── Poststart
//	 (always, reverse order, idempotent)
//
// Each concern is one hook that implements the events it cares about; the
// runner calls them in the order of the list runHooks builds, and no hook
// calls another or holds the runner: what a hook needs comes in its
// request, what it gives back goes in its response.
//
// Configure is pure: it contributes environment, mounts, wrapper and labels
// to the container plan. A hook whose contribution depends on what its
// Prestart made (the egress proxy's certificate authority) must sit above
// the create point, so the container is planned only after it started.
type hook interface {
	// name identifies the hook in logs.
	name() string
}

// configureRequest is the container plan a Configure hook extends.
type configureRequest struct {
	Spec *sandbox.Spec
}

// configureHook contributes to the run's container plan.
type configureHook interface {
	hook
	configure(req *configureRequest)
}

// prestartRequest is what a Prestart hook may use of the run so far.
type prestartRequest struct {
	// Owner is who the agent runs as and owns its directories.
	Owner workspace.Owner
	// Records is the run's host record budget.
	Records *records.Budget
}

// prestartResponse is what a Prestart hook reports to the runner.
type prestartResponse struct {
	// DiskCapMounted says the hook mounted the run dir's disk cap.
	DiskCapMounted bool
	// Stdout and Stderr are where the container's output goes, when the
	// hook made them.
	Stdout, Stderr io.Writer
	// StderrFilter, when set, wraps the container's stderr once every
	// Prestart hook ran: the self-check's report is read off it first.
	StderrFilter func(io.Writer) io.Writer
}

// prestartHook makes something the container needs before it starts. A
// failure fails the run: later Prestart hooks are not called, Exited,
// Collect and Stop still are.
type prestartHook interface {
	hook
	prestart(ctx context.Context, req *prestartRequest, resp *prestartResponse) error
}

// starterHook starts the run's container itself, in place of the backend
// and of any create ahead: a claimed warm slot's parked container.
type starterHook interface {
	hook
	start(ctx context.Context, spec sandbox.Spec, streams sandbox.Streams) (sandbox.Handle, error)
}

// poststartRequest is what a Poststart hook may use of the live container.
type poststartRequest struct {
	// Stop stops the container: the run ends as it is.
	Stop context.CancelFunc
	// Hard is the run's shutdown context: what must outlive the run's
	// cancellation (the output's consumers) runs on it.
	Hard context.Context
	// Handle is the live container; only its Posture and optional
	// StatsReader may be called, concurrently with the runner's Wait.
	Handle sandbox.Handle
}

// poststartHook starts what runs beside the live container.
type poststartHook interface {
	hook
	poststart(ctx context.Context, req *poststartRequest)
}

// gateRequest is what a gate may use of the started container.
type gateRequest struct {
	// Run is the run's context (the gate's own ends once the container
	// exited).
	Run context.Context
	// Handle is the started container.
	Handle sandbox.Handle
	// HostFacts yields the engine's host facts once (prefetchHostFacts).
	HostFacts <-chan hostFactsResult
}

// gateResponse is what a gate found of the started container.
type gateResponse struct {
	// GoAhead says the agent was let go.
	GoAhead bool
	// ImageDigest and Runtime are the container's as inspected; empty
	// when it was not.
	ImageDigest, Runtime string
}

// gateHook is a Poststart hook that decides whether the agent may run:
// the runner runs it beside the container, from its start, with a
// context that ends once the container exited, and reports RUNNING once
// it gave the go-ahead. Its error stops the container and fails the run.
type gateHook interface {
	hook
	gate(ctx context.Context, req *gateRequest, resp *gateResponse) error
}

// exitedRequest says how the container ended; zero when it never started.
type exitedRequest struct {
	Result sandbox.Result
}

// exitedResponse is what the Exited hooks report about the run; each hook
// sets the fields it owns.
type exitedResponse struct {
	// PromptTokens, CompletionTokens and ModelUpstream are the model
	// gateway's metering and what its upstream last answered.
	PromptTokens     *int
	CompletionTokens *int
	ModelUpstream    string
	// Egress is the egress part of the isolation record.
	Egress *audit.EgressRecord
	// Isolation is the isolation record, but for its egress part; nil
	// when no container was inspected.
	Isolation *audit.Record
	// ReadOnlyRootWrite, StreamEnded and DroppedOutputBytes are the
	// output's: see execution.
	ReadOnlyRootWrite  bool
	StreamEnded        bool
	DroppedOutputBytes int64
	// Usage is what the container used (metricsHook); nil when it was
	// not sampled.
	Usage *sandbox.Usage
}

// exitedHook ends what served the container once it is over (or never
// started after the hook's Prestart); its error fails the run. Exited
// hooks run in the list's order, after the gate returned.
type exitedHook interface {
	hook
	exited(ctx context.Context, req *exitedRequest, resp *exitedResponse) error
}

// collectRequest stores the executor's own records.
type collectRequest struct {
	// Kept stores the executor-private file name as the run object
	// objectName; a missing file is skipped.
	Kept func(ctx context.Context, name, objectName, contentType string) error
	// Global stores the executor-private file name under key in the
	// user's run-global storage; a missing file is skipped.
	Global func(ctx context.Context, name, key, contentType string) error
	// Put stores r as the run object name, as one of the run's objects.
	Put func(ctx context.Context, name string, r io.Reader, contentType string) (persist.ObjectInfo, error)
	// Stored records the result of a store the hook made itself: a
	// stored object is one of the run's objects. It passes err through.
	Stored func(info persist.ObjectInfo, err error) error
}

// collectResponse is what the Collect hooks stored that the run's outcome
// names.
type collectResponse struct {
	// Changes is the stored change set; nil when the run has none.
	Changes *changeResult
	// Output is the head of the stored output log.
	Output []byte
	// Artifacts are the stored artifacts, in path order; ArtifactsDir is
	// the host directory they came from. TracePath is set when the agent
	// wrote this run's trace.
	Artifacts    []persist.ObjectInfo
	ArtifactsDir string
	TracePath    string
	// Skipped lists the agent's files not stored (the first
	// workspace.MaxSkips); DroppedSkips counts the others.
	Skipped      []SkippedFile
	DroppedSkips int64
}

// collectHook stores what the hook owns, in the records' order. It also
// runs for a kept run (RetryPersist, recoverRun) from its local copy.
type collectHook interface {
	hook
	collect(ctx context.Context, req *collectRequest, resp *collectResponse) error
}

// besideCollectHook stores its part of the run's objects concurrently
// with the Collect hooks (the agent's files, which take longest); step
// gets each of its steps' error with what it stored.
type besideCollectHook interface {
	hook
	collectBeside(ctx context.Context, req *collectRequest, resp *collectResponse, step func(err error, what string))
}

// sealRequest is what a Seal hook covers.
type sealRequest struct {
	// Objects are the run's objects stored so far.
	Objects func() []persist.ObjectInfo
	// Exec and Verdict are the run's execution and verdict.
	Exec    execution
	Verdict verdict
}

// sealHook stores, once every Collect hook stored its own, what covers
// the run's objects (the collection record, the attestation).
type sealHook interface {
	hook
	seal(ctx context.Context, req *sealRequest, resp *collectResponse, step func(err error, what string))
}

// stopRequest says how the run's collection ended.
type stopRequest struct {
	// PersistErr is collection's failure: the run's local files are then
	// its kept copy, for RetryPersist.
	PersistErr error
}

// stopHook releases what the hook holds, once the container is gone and
// the run collected. Stop is always called, in reverse order, and must be
// idempotent.
type stopHook interface {
	hook
	stop(ctx context.Context, req *stopRequest)
}

// runHooks is the run's hook list, in lifecycle order, with its create
// point: each concern is in it only when the run needs it.
func runHooks(p *plan, wd *workdir) (hooks []hook, createAt int) {
	if warm := warmHookOf(p, wd); warm != nil {
		hooks, createAt = []hook{warm}, -1 // its container, uid and capped dir exist
	} else {
		hooks = []hook{&uidHook{p: p, wd: wd}, &rundirHook{p: p, wd: wd}}
		// The engine creates the container once the run has its uid and
		// its (empty) run directory: it reads the directory only at start.
		createAt = len(hooks)
		hooks = append(hooks, &dirsHook{p: p, wd: wd})
	}
	// The gateway hook is inert without a model, but times its (empty)
	// start for every run, so every run lists the same phases.
	hooks = append(hooks, &selfCheckHook{p: p, wd: wd}, &workspaceHook{p: p, wd: wd}, &changesHook{p: p}, &outputHook{p: p}, &gatewayHook{p: p}, &filesHook{p: p, wd: wd})
	if p.limits.disk > 0 {
		hooks = append(hooks, &diskWatchHook{p: p, wd: wd})
	}
	if p.caps.Stats {
		hooks = append(hooks, &metricsHook{p: p, interval: usageInterval})
	}
	if !p.in.Egress.IsZero() {
		// The container's routing names the CA the proxy makes at start.
		hooks, createAt = append(hooks, &egressHook{p: p}), -1
	}
	return hooks, createAt
}
