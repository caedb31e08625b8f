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
	// SessionID names the agent session. All three are required.
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
	// Model is the model the agent may use through the run's gateway;
	// Egress what it may reach (zero: nothing).
	Model  config.ModelEntry
	Egress egress.Policy
	// Image is the run image (a digest reference runs exactly that
	// image); Command and Entrypoint replace the image's as `docker run`
	// does; Env adds NAME=VALUE variables visible to the agent (no
	// secrets: names taskrun sets itself are refused).
	Image      string
	Command    []string
	Entrypoint []string
	Env        []string
	// Policy replaces the host's default policy when set.
	Policy *sandbox.Policy
	// Timeout, MaxOutputBytes and DiskLimitBytes replace the host's
	// defaults when non-zero.
	Timeout        time.Duration
	MaxOutputBytes int64
	DiskLimitBytes int64
	// SessionExcludes replaces the host's default when non-nil;
	// ChangeExcludes are left out of the run's change set
	// (changeset.DefaultExcludes when nil, nothing when empty);
	// KeepRunDir keeps the run directory after a successful run.
	SessionExcludes []string
	ChangeExcludes  []string
	KeepRunDir      bool
	// Labels are added to the run's container.
	Labels map[string]string
	// Stdout and Stderr, when set, receive live copies of the run's
	// output; Timings, when set, records its phases.
	Stdout  io.Writer
	Stderr  io.Writer
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
