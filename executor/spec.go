package executor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/fencedstore"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workerclient"
)

// Spec is one run: what the CLI or the control plane asked for. A zero
// field takes the host's default (Config.Defaults). The host never writes
// it.
type Spec struct {
	// Task is the task to run; its UserID, ConversationID and ID place the
	// run. Run is the run (Run.PreviousRunID names a run to resume);
	// SessionID names the agent session (traces go under
	// traces/<SessionID>/). All three are required.
	Task      *model.Task
	Run       *model.TaskRun
	SessionID string
	// Updater receives the run's status (required); StreamSender, when
	// set, its stdout as deltas.
	Updater      TaskRunUpdater
	StreamSender workerclient.StreamSender
	// Lease, when set, fences the run: every write of its objects confirms
	// the lease first, and the journal keeps the lease for recovery.
	Lease *Lease
	// Model is the model the agent may use through the run's gateway.
	Model config.ModelEntry
	// Egress is what the agent may reach. Zero means no route out at all;
	// otherwise the container, still with network none, reaches what the
	// policy allows through a per-run proxy (package egress), which needs
	// the relay among the host's helpers.
	Egress egress.Policy
	// Image is the run image; a digest reference (name@sha256:...) runs
	// exactly that image.
	Image string
	// Command replaces the image's default command when non-empty;
	// Entrypoint replaces its entrypoint, as `docker run --entrypoint`
	// does: the container runs Entrypoint followed by Command, and the
	// image's own command is dropped.
	Command    []string
	Entrypoint []string
	// Env adds NAME=VALUE variables to the agent's environment, after the
	// image's own. It is visible to the agent and everything it runs: a
	// secret belongs to the model gateway (Model) or the credential broker,
	// never here. Names taskrun sets itself (TASKRUN_*, HOME, the proxy
	// variables) are refused (see config.CheckEnv).
	Env []string
	// Policy replaces the host's default policy when set.
	Policy *sandbox.Policy
	// Timeout bounds the container's run time. MaxOutputBytes caps the
	// stdout and the stderr kept from the run, each (negative: no cap);
	// output past the cap is drained from the container and counted but
	// not kept, so a flooding agent cannot fill the host disk.
	// DiskLimitBytes caps what the run may store under /taskrun (negative:
	// no cap). Each replaces the host's default when non-zero.
	Timeout        time.Duration
	MaxOutputBytes int64
	DiskLimitBytes int64
	// SessionExcludes are the glob patterns (relative to home) left out of
	// the session state; the host's default when nil. ChangeExcludes are
	// the patterns (same syntax) left out of the run's change set, so
	// neither changes.patch nor `taskrun apply` carries them:
	// changeset.DefaultExcludes (the reference agent's state) when nil,
	// nothing when empty; changes.json lists them.
	SessionExcludes []string
	ChangeExcludes  []string
	// KeepRunDir keeps the run directory on the host after a successful
	// run; by default it is removed once everything is persisted.
	KeepRunDir bool
	// Labels are added to the run's container next to the dev.taskrun.*
	// labels, e.g. a test framework's session labels so its reaper finds it.
	Labels map[string]string
	// Stdout, when set, receives a live copy of the run's stdout, fed
	// independently of StreamSender so neither can hold up the other;
	// Stderr, when set, the run's stderr live.
	Stdout io.Writer
	Stderr io.Writer
	// Timings, when set, records the run's phases (see package timings);
	// by default the run makes a Recorder. Either way the spans end up in
	// Outcome.Timings and in the run's index record.
	Timings *timings.Recorder
	// OnUsage, when set, is called with the run's resource usage so far
	// after each live sample of its container's counters (a backend with
	// sandbox.Capabilities.Stats), from the sampler's goroutine.
	OnUsage func(sandbox.Usage)
}

// Lease is the control plane lease a run executes under.
type Lease struct {
	// Epoch and Token are the lease's fencing token, journaled.
	Epoch int64
	Token string
	// Confirm, when set, is asked before every write of the run's objects;
	// an error refuses the write (fencedstore).
	Confirm fencedstore.Confirm
}

// Validate refuses a spec no host could run, with errors wrapping
// ErrInvalidInput. Host.Run applies the same rules (a refused run
// is reported FAILED through its Updater); Validate lets a caller refuse
// bad input before it builds anything.
func (s Spec) Validate() error {
	var errs []error
	missing := func(cond bool, what string) {
		if cond {
			errs = append(errs, fmt.Errorf("%w: Spec.%s is required", ErrInvalidInput, what))
		}
	}
	missing(s.Task == nil, "Task")
	missing(s.Run == nil, "Run")
	missing(s.Updater == nil, "Updater")
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	ids := [][2]string{
		{"user", s.Task.UserID}, {"conversation", s.Task.ConversationID},
		{"task", s.Task.ID}, {"run", s.Run.ID}, {"session", s.SessionID},
	}
	if s.Run.PreviousRunID != "" {
		ids = append(ids, [2]string{"previous run", s.Run.PreviousRunID})
	}
	if s.Run.ParentRunID != "" {
		ids = append(ids, [2]string{"parent run", s.Run.ParentRunID})
		if s.Run.PreviousRunID != "" {
			errs = append(errs, fmt.Errorf("%w: run %q names both a previous run and a parent: a fork starts from its parent alone", ErrInvalidInput, s.Run.ID))
		}
		if s.Run.ParentRunID == s.Run.ID {
			errs = append(errs, fmt.Errorf("%w: run %q names itself as its parent", ErrInvalidInput, s.Run.ID))
		}
	}
	for _, id := range ids {
		if err := model.ValidateID(id[0], id[1]); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidInput, err))
		}
	}
	if s.Run.TaskID != "" && s.Run.TaskID != s.Task.ID {
		errs = append(errs, fmt.Errorf("%w: run %q belongs to task %q, not %q", ErrInvalidInput, s.Run.ID, s.Run.TaskID, s.Task.ID))
	}
	if err := config.CheckEnv(s.Env); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidInput, err))
	}
	if dir := s.Task.WorkspaceDir; dir != "" {
		if info, err := os.Stat(dir); err != nil || !info.IsDir() {
			errs = append(errs, fmt.Errorf("%w: workspace %q is not a directory; pass an existing directory", ErrInvalidInput, dir))
		}
	}
	if s.Timeout < 0 {
		errs = append(errs, fmt.Errorf("%w: Spec.Timeout %v: give a positive duration, or zero for the host's default", ErrInvalidInput, s.Timeout))
	}
	return errors.Join(errs...)
}

// runID is the spec's run ID, for logs.
func runID(s Spec) string {
	if s.Run == nil {
		return ""
	}
	return s.Run.ID
}
