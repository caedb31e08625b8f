package taskrun

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/workerclient"
)

// refuseReportTimeout bounds reporting a refused run, on a context
// detached from the caller's cancellation.
const refuseReportTimeout = 2 * time.Minute

// rooted is a RuntimePaths that knows its runs root
// (NewRuntimePathsFromRoot's).
type rooted interface{ Root() string }

// check refuses input no host can be built from, with errors wrapping
// ErrInvalidInput: the seed's required fields, and a Sandbox for a run
// (run is false for a persist retry or a warm template, which run
// nothing).
func (in RunTaskInput) check(run bool) error {
	var errs []error
	missing := func(cond bool, what string) {
		if cond {
			errs = append(errs, fmt.Errorf("%w: %s is required", ErrInvalidInput, what))
		}
	}
	missing(in.Task == nil, "Task")
	missing(in.Run == nil, "Run")
	missing(in.Paths == nil, "Paths")
	missing(in.Persist == nil, "Persist")
	missing(in.ArtifactStorage == nil, "ArtifactStorage")
	missing(in.Updater == nil, "Updater")
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if _, ok := in.Paths.(rooted); !ok {
		return fmt.Errorf("%w: Paths %T has no runs root (Root() string), which holds the journal and the disk admission: use NewRuntimePathsFromRoot", ErrInvalidInput, in.Paths)
	}
	if run && in.Sandbox == nil {
		return fmt.Errorf("%w: Sandbox is required", ErrInvalidInput)
	}
	return nil
}

// findHelpers is helpers.FromExecutable, replaced by tests.
var findHelpers = helpers.FromExecutable

// secure gives in, for a run or a warm template, the machine `taskrun run`
// has by default (openHost in cmd/taskrun): without UIDs (and SharedUID), a
// uid pool of uidpool.DefaultRange with the runs root's leases, or the
// warm pool's own; without Helpers or HelpersDir (and NoSelfCheck), the
// running program as its own helpers, cached under the runs root. What
// cannot be had refuses the run with ErrInvalidInput and the fix. in has
// passed check.
func (in RunTaskInput) secure() (RunTaskInput, error) {
	layout, err := executor.NewLayout(in.Paths.(rooted).Root())
	if err != nil {
		return in, fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	if in.UIDs == nil && !in.SharedUID {
		if in.WarmPool != nil {
			in.UIDs = in.WarmPool.UIDs()
		}
		if in.UIDs == nil {
			if in.UIDs, err = uidpool.New(layout.UIDLeaseDir(), uidpool.DefaultRange()); err != nil {
				return in, fmt.Errorf("%w: a host uid per run: %w; give UIDs a pool of your own (uidpool.New), or set SharedUID to run every run as Policy.User", ErrInvalidInput, err)
			}
		}
	}
	if len(in.Helpers) == 0 && in.HelpersDir == "" && !in.NoSelfCheck {
		if in.Helpers, err = findHelpers(layout.HelpersDir()); err != nil {
			return in, fmt.Errorf("%w: the in-sandbox self-check has no helpers: %w; set HelpersDir to a directory of static taskrun-probe and taskrun-relay (`make build` puts them in bin/), build this program with CGO_ENABLED=0 so it serves as its own, or set NoSelfCheck to run without the self-check", ErrInvalidInput, err)
		}
	}
	return in, nil
}

// host builds the executor.Host of in's machine; in has passed check.
// Its errors wrap ErrInvalidInput and executor.ErrConfig.
func (in RunTaskInput) host(ctx context.Context) (*executor.Host, error) {
	h, err := executor.New(ctx, executor.Config{
		Root:           in.Paths.(rooted).Root(),
		Paths:          in.Paths,
		Journal:        in.Journal,
		Backend:        in.Sandbox,
		Store:          hostStore(in.Persist, in.ArtifactStorage),
		Artifacts:      in.ArtifactStorage,
		StoreURL:       in.StoreURL,
		Executor:       in.Executor,
		UIDs:           in.UIDs,
		WarmPool:       in.WarmPool,
		Helpers:        in.Helpers,
		HelpersDir:     in.HelpersDir,
		Pull:           in.Pull,
		AllowedImages:  in.AllowedImages,
		EgressRoots:    in.EgressRoots,
		PersistTimeout: in.PersistTimeout,
		ReportTimeout:  in.ReportTimeout,
		ShutdownGrace:  in.ShutdownGrace,
		AttestKey:      in.AttestKey,
		Version:        in.Version,
		ControlPlane:   in.ControlPlane,
		Logger:         in.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	return h, nil
}

// spec is in's run: everything but its machine. A zero field takes the
// same default on the host as in the seed's input.
func (in RunTaskInput) spec() executor.Spec {
	s := executor.Spec{
		Task: in.Task, Run: in.Run, SessionID: in.SessionID,
		Updater: in.Updater, StreamSender: in.StreamSender,
		Model: in.Model, Egress: in.Egress,
		Image: in.Image, Command: in.Command, Entrypoint: in.Entrypoint, Env: in.Env,
		Timeout: in.Timeout, MaxOutputBytes: in.MaxOutputBytes, DiskLimitBytes: in.DiskLimitBytes,
		SessionExcludes: in.SessionExcludes, ChangeExcludes: in.ChangeExcludes, KeepRunDir: in.KeepRunDir,
		Labels: in.Labels, Stdout: in.Stdout, Stderr: in.Stderr, Timings: in.Timings,
	}
	if in.Policy != (sandbox.Policy{}) {
		p := in.Policy
		s.Policy = &p
	}
	return s
}

// hostStore is persist as the host's executor.Store: itself when it keeps
// artifacts too, else with artifacts beside it (Config.Artifacts takes the
// artifacts either way). A run index it writes stays written.
func hostStore(files persist.PersistStorage, artifacts persist.ArtifactStorage) executor.Store {
	if s, ok := files.(executor.Store); ok {
		return s
	}
	split := splitStore{files, artifacts}
	if w, ok := files.(runindex.Writer); ok {
		return indexedStore{split, w}
	}
	return split
}

// splitStore is the seed's two stores as one.
type splitStore struct {
	persist.PersistStorage
	persist.ArtifactStorage
}

// indexedStore is a splitStore whose run files keep the run index.
type indexedStore struct {
	splitStore
	runindex.Writer
}

// refuse reports a run refused before it had a host, as the host reports a
// refused spec: FAILED (CANCELLED when ctx is done) with cause as the
// reason, when input names a run and an updater.
func refuse(ctx context.Context, in RunTaskInput, cause error) (*Outcome, error) {
	status := model.StatusFailed
	if ctx.Err() != nil {
		status = model.StatusCancelled
	}
	out := &Outcome{Status: status, Reason: cause.Error(), Result: RunResult{EndTime: time.Now().UnixMilli()}}
	if in.Timings != nil {
		out.Timings = in.Timings.Spans()
	}
	if in.Updater != nil && in.Run != nil && model.ValidateID("run", in.Run.ID) == nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refuseReportTimeout)
		defer cancel()
		req := &workerclient.PatchTaskRunRequest{Status: status, EndedAt: &out.Result.EndTime, Error: &out.Reason}
		if err := in.Updater.UpdateRunStatus(rctx, in.Run.ID, req); err != nil {
			cause = errors.Join(cause, fmt.Errorf("report %s: %w", status, err))
		}
	}
	return out, &RunError{Status: status, Reason: out.Reason, Err: cause}
}
