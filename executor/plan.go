package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/imageref"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/records"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/warmpool"
	"github.com/taskrun/taskrun/workspace"
)

// hostDirSuffix names the executor-private directory beside a run directory.
const hostDirSuffix = ".executor"

// DefaultDiskLimitBytes caps what a run may store under /taskrun.
const DefaultDiskLimitBytes = 2 << 30

// defaultStopGrace is how long a stopped container gets between SIGTERM and
// SIGKILL.
const defaultStopGrace = 10 * time.Second

// plan is one run's input validated, defaulted and frozen: what every later
// phase reads and none writes.
type plan struct {
	// in is the caller's input, for the collaborators it names (Persist,
	// Updater, Sandbox, StreamSender, ...); its defaulted values are below.
	in  runInput
	log *slog.Logger
	// ref identifies the run everywhere: host dirs, blob keys, labels.
	ref  model.RunRef
	dirs workspace.RunDirs
	// hostDir holds executor-private files (output spools, kept records):
	// beside the run directory, never inside the bind mount, so the agent
	// cannot touch them.
	hostDir string
	policy  sandbox.Policy
	// spec is the container before the run's helpers and gateway are added;
	// use containerSpec for a copy to extend.
	spec   sandbox.Spec
	limits limits
	// tracePath and gatewayRecordPath are the run's keys in run-global
	// storage: the agent's trace and the executor-owned gateway record.
	tracePath         string
	gatewayRecordPath string
	sessionExcludes   []string
	keepRunDir        bool
	// helpers are the helper files mounted into the container; nil when
	// the run has no self-check.
	helpers helpers.Files
	// restoreMounts are the helper files' mounts of a run restored from
	// a memory checkpoint, which runs without the self-check.
	restoreMounts []sandbox.Mount
	// slot is the warm container the run claimed (claimWarm); nil for a
	// cold run. The run's dirs are then the slot's.
	slot *warmpool.Slot
	// timings records how long each phase takes; nil records nothing (a
	// persist retry).
	timings *timings.Recorder
	// pull is the run's pull policy.
	pull sandbox.PullPolicy
	// caps is what the run's backend does beyond sandbox.Backend (a
	// persist retry, which has none, is Docker's that implements nothing).
	caps sandbox.Capabilities
	// image is the run's image as the backend resolved it in preflight
	// (its ID and repo digest); zero when the backend resolves none.
	image sandbox.Image
}

// ErrImageNotAllowed is wrapped when the run's image matches none of
// Config.AllowedImages.
var ErrImageNotAllowed = imageref.ErrNotAllowed

// allowedImagesFlag names the allow list in refusals, as the CLI spells it.
const allowedImagesFlag = "--allowed-images"

// limits are the run's resolved caps; 0 means none.
type limits struct {
	// maxOutput caps each output stream kept.
	maxOutput int64
	// disk caps what the run stores under its run directory.
	disk int64
	// records is the byte budget of the host-side records the executor
	// writes for the run (records.LimitFor the disk cap).
	records int64
	// collect caps what collection reads from the run directory in total:
	// the disk cap, or maxCollectTotalBytes without one.
	collect int64
}

// newPlan validates in and resolves every default. Bad input is refused here,
// before anything touches disk or Docker.
func newPlan(in runInput) (*plan, error) {
	if err := validateInput(in); err != nil {
		return nil, err
	}
	log := in.Logger
	if log == nil {
		log = slog.Default()
	}
	p := &plan{
		in:              in,
		log:             log.With("run", in.Run.ID, "task", in.Task.ID, "user", in.Task.UserID),
		ref:             model.RunRef{UserID: in.Task.UserID, ConversationID: in.Task.ConversationID, TaskID: in.Task.ID, RunID: in.Run.ID},
		policy:          in.Policy,
		sessionExcludes: in.SessionExcludes,
		keepRunDir:      in.KeepRunDir,
		limits: limits{
			maxOutput: resolveCap(in.MaxOutputBytes, DefaultMaxOutputBytes),
			disk:      resolveCap(in.DiskLimitBytes, DefaultDiskLimitBytes),
		},
	}
	p.limits.records = records.LimitFor(p.limits.disk)
	p.limits.collect = p.limits.disk
	if p.limits.collect == 0 {
		p.limits.collect = maxCollectTotalBytes
	}
	if p.sessionExcludes == nil {
		p.sessionExcludes = workspace.DefaultExcludes
	}
	ref := p.ref
	p.dirs = workspace.RunDirs{
		Dir:       in.Paths.RuntimeTaskRunDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID),
		Home:      in.Paths.RuntimeTaskRunHomeDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID),
		Artifacts: in.Paths.RuntimeTaskRunArtifactsDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID),
		Global:    in.Paths.RuntimeTaskRunGlobalDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID),
		Output:    in.Paths.RunOutputDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID),
	}
	p.hostDir = p.dirs.Dir + hostDirSuffix
	p.caps = sandbox.CapabilitiesOf(in.Sandbox)
	if p.policy == (sandbox.Policy{}) {
		p.policy = sandbox.DefaultPolicy()
	}
	if err := p.policy.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	if err := p.resolveRecordPaths(); err != nil {
		return nil, err
	}
	var err error
	if p.helpers, err = resolveHelpers(in); err != nil {
		return nil, err
	}
	if in.restore != nil && in.restore.manifest.Kind == sandbox.CheckpointMemory {
		// A restored sandbox goes on past its self-check: no wrapper, no
		// hold waits for it. The live audit still inspects it. Its helper
		// files are mounted where they were: gVisor restores a sandbox
		// with the mounts it was checkpointed with.
		p.restoreMounts = p.helpers.Mounts()
		p.helpers = nil
	}
	p.spec = p.baseSpec()
	if p.pull, err = sandbox.ParsePullPolicy(string(in.Pull)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	if err := checkImageAllowed(p.spec.Image, in.AllowedImages); err != nil {
		return nil, err
	}
	if err := p.checkEgress(); err != nil {
		return nil, err
	}
	if _, err := workspace.Matcher(in.ChangeExcludes); err != nil {
		return nil, fmt.Errorf("%w: change set excludes: %w", ErrInvalidInput, err)
	}
	return p, nil
}

// resolveRecordPaths sets where the run's trace and gateway record go in
// its session's records.
func (p *plan) resolveRecordPaths() error {
	var err error
	if p.tracePath, err = persist.TracePath(p.in.SessionID, p.ref.RunID); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	if p.gatewayRecordPath, err = persist.GatewayRecordPath(p.in.SessionID, p.ref.RunID); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	return nil
}

// resolveHelpers returns the run's helper files. A helpers directory without
// a usable self-check is an error: the self-check is never skipped silently.
func resolveHelpers(in runInput) (helpers.Files, error) {
	switch {
	case len(in.Helpers) > 0 && in.HelpersDir != "":
		return nil, fmt.Errorf("%w: set Helpers or HelpersDir, not both", ErrInvalidInput)
	case len(in.Helpers) > 0:
		if _, ok := in.Helpers[helpers.ProbeName]; !ok {
			return nil, fmt.Errorf("%w: the helpers have no %s", ErrIsolation, helpers.ProbeName)
		}
		return in.Helpers, nil
	case in.HelpersDir != "":
		files, err := helpers.FromDir(in.HelpersDir)
		if err != nil {
			return nil, fmt.Errorf("%w: self-check: %w", ErrIsolation, err)
		}
		return files, nil
	}
	return nil, nil
}

// resolveCap maps a cap as given (0 for the default, negative for none) to
// bytes, 0 meaning none.
func resolveCap(given, def int64) int64 {
	switch {
	case given < 0:
		return 0
	case given == 0:
		return def
	}
	return given
}

// baseSpec is the container to run: the image, the run directory mounted at
// /taskrun, the identity in the environment and the labels.
func (p *plan) baseSpec() sandbox.Spec {
	image := p.in.Image
	if image == "" {
		image = DefaultImage
	}
	timeout := p.in.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	labels := maps.Clone(p.in.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	// The run dir's host path lets `taskrun audit` check the bind mount's
	// source exactly.
	labels[sandbox.LabelRunDir] = p.dirs.Dir
	return sandbox.Spec{
		Name:       ContainerName(p.ref.RunID),
		Image:      image,
		Entrypoint: slices.Clone(p.in.Entrypoint),
		Cmd:        slices.Clone(p.in.Command),
		WorkingDir: model.ContainerHomeDir,
		// The run's own variables last: they win over any the caller set.
		Env: append(slices.Clone(p.in.Env),
			"HOME="+model.ContainerHomeDir,
			"TASKRUN_RUN_ID="+p.ref.RunID,
			"TASKRUN_TASK_ID="+p.ref.TaskID,
			"TASKRUN_SESSION_ID="+p.in.SessionID,
			"TASKRUN_PROMPT_FILE="+model.ContainerRunDir+"/"+model.PromptFileName,
		),
		Mounts:    []sandbox.Mount{{Source: p.dirs.Dir, Target: model.ContainerRunDir}},
		Labels:    labels,
		Run:       p.ref,
		Timeout:   timeout,
		StopGrace: defaultStopGrace,
		DiskBytes: max(p.limits.disk, 0),
	}
}

// containerSpec returns a copy of the planned container that a phase may
// extend (helpers, gateway) without changing the plan.
func (p *plan) containerSpec() sandbox.Spec {
	s := p.spec
	s.Cmd = slices.Clone(s.Cmd)
	s.Entrypoint = slices.Clone(s.Entrypoint)
	s.Wrapper = slices.Clone(s.Wrapper)
	s.Env = slices.Clone(s.Env)
	s.Mounts = slices.Clone(s.Mounts)
	s.Labels = maps.Clone(s.Labels)
	return s
}

// checkImageAllowed refuses an image that matches none of the allowed
// image patterns, or a list that does not parse.
func checkImageAllowed(image string, allowed []string) error {
	list, err := imageref.ParseAllowlist(allowed)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalidInput, allowedImagesFlag, err)
	}
	return list.Check(image, allowedImagesFlag)
}

// preflight makes the run's image available (pulling it when the pull
// policy says so) or refuses a run whose image is missing, before anything
// is written.
func (p *plan) preflight(ctx context.Context) error {
	switch b := p.in.Sandbox; {
	case p.caps.ResolvesImages:
		img, err := b.(sandbox.ImageResolver).ResolveImage(ctx, p.spec.Image, p.pull)
		if err != nil {
			return err
		}
		p.image = img
		p.log.Info("image", "image", img.Ref, "id", img.ID, "digest", img.Digest(), "pulled", img.Pulled)
	case p.caps.ChecksImages:
		return b.(sandbox.ImageChecker).CheckImage(ctx, p.spec.Image)
	}
	return nil
}

// validateInput refuses bad input before anything touches disk or Docker.
func validateInput(in runInput) error {
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
	ids := []struct{ kind, id string }{
		{"user", in.Task.UserID}, {"conversation", in.Task.ConversationID},
		{"task", in.Task.ID}, {"run", in.Run.ID}, {"session", in.SessionID},
	}
	if in.Run.PreviousRunID != "" {
		ids = append(ids, struct{ kind, id string }{"previous run", in.Run.PreviousRunID})
	}
	for _, id := range ids {
		if err := model.ValidateID(id.kind, id.id); err != nil {
			errs = append(errs, err)
		}
	}
	if in.Run.TaskID != "" && in.Run.TaskID != in.Task.ID {
		errs = append(errs, fmt.Errorf("%w: run %q belongs to task %q, not %q", ErrInvalidInput, in.Run.ID, in.Run.TaskID, in.Task.ID))
	}
	if err := config.CheckEnv(in.Env); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidInput, err))
	}
	if dir := in.Task.WorkspaceDir; dir != "" {
		if info, err := os.Stat(dir); err != nil || !info.IsDir() {
			errs = append(errs, fmt.Errorf("%w: workspace %q is not a directory; pass an existing directory with --workspace", ErrInvalidInput, dir))
		}
	}
	return errors.Join(errs...)
}
