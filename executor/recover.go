package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/fencedstore"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/recovery"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/warmpool"
	"github.com/taskrun/taskrun/workerclient"
)

// RecoverDeadline bounds each recovered run's storing and reporting.
const RecoverDeadline = DefaultPersistTimeout + DefaultReportTimeout

// StartupRecoveryBudget bounds the runs Recover finishes: what it cannot
// store within it is kept for RetryKept (or taskrun persist --all), so a
// hung store never holds a new run.
const StartupRecoveryBudget = 30 * time.Second

// Reaper removes the sandboxes of executors proven gone on a backend that
// does not list its containers (the Kubernetes backend's Pods); see
// Config.Reaper.
type Reaper interface {
	// ReapGone removes the sandboxes whose executor gone proves gone, by its
	// ID and, when the sandbox carries it, its process record.
	ReapGone(ctx context.Context, gone func(executorID, process string) (bool, string)) error
}

// Recover is the start-up garbage collection of a host: on a backend that
// lists its containers (sandbox.Capabilities.ListsContainers) it finishes
// the journaled runs whose executor is gone (storing and reporting them
// within StartupRecoveryBudget), removes their and the gone executors'
// leftover containers and the gone executors' locks; on another backend it
// asks Config.Reaper to remove the gone executors' sandboxes. Failures are
// logged: they never stop the host.
func (h *Host) Recover(ctx context.Context) {
	o, ok := h.cfg.Backend.(sandbox.Orphans)
	if !ok || !sandbox.CapabilitiesOf(h.cfg.Backend).ListsContainers {
		if h.cfg.Reaper != nil {
			if err := h.cfg.Reaper.ReapGone(ctx, h.ExecutorProcessGone); err != nil {
				h.log.Warn("reap leftover sandboxes", "err", err)
			}
		}
		return
	}
	recoverCtx, cancel := context.WithTimeout(ctx, StartupRecoveryBudget)
	results, err := h.recoverRuns(recoverCtx, o, false, io.Discard)
	cancel()
	for _, res := range results {
		if res.Action == recovery.ActionRecovered || res.Action == recovery.ActionFailed {
			h.log.Info("recovered a run whose executor is gone", "run", res.RunID, "action", res.Action, "why", res.Why)
		}
	}
	if err != nil {
		h.log.Warn("recover runs of gone executors", "err", err)
	}
	removed, err := o.ReapGone(ctx, h.ExecutorProcessGone, spared(results))
	if err != nil {
		h.log.Warn("reap leftover containers", "err", err)
	} else if removed > 0 {
		h.log.Info("removed leftover containers", "count", removed)
	}
	h.RemoveGoneExecutors()
}

// RetryKept retries every kept run of the root once (see RetryKeptRuns),
// logging what failed, and returns how many are still kept: the worker's
// background retry (recovery.RetryLoop).
func (h *Host) RetryKept(ctx context.Context) int {
	still, err := h.RetryKeptRuns(ctx, io.Discard)
	if err != nil {
		h.log.Warn("retry kept runs", "still_kept", still, "err", err)
	}
	return still
}

// ExecutorGone proves an executor gone by its instance lock.
func (h *Host) ExecutorGone(id string) (bool, string) {
	gone, why, err := instance.Gone(h.layout.ExecutorsDir(), instance.Info{ID: id})
	if err != nil {
		return false, err.Error()
	}
	return gone, why
}

// ExecutorProcessGone is ExecutorGone for a container that may carry its
// executor's process record: an executor that exited cleanly removed its
// lock file, and the record then proves it gone.
func (h *Host) ExecutorProcessGone(id, process string) (bool, string) {
	gone, why, err := instance.Gone(h.layout.ExecutorsDir(), instance.ParseProcess(id, process))
	if err != nil {
		return false, err.Error()
	}
	return gone, why
}

// recoveryInput is the runInput that names a journaled run, with its
// store and control plane opened from the record (a leased run's writes
// and reports fenced with its journaled lease); closeFn releases them.
func (h *Host) recoveryInput(ctx context.Context, rec journal.Record) (in runInput, closeFn func(), err error) {
	jd, err := h.Journal()
	if err != nil {
		return in, nil, err
	}
	store, err := persist.Open(ctx, rec.Store)
	if err != nil {
		return in, nil, fmt.Errorf("run %s: store %s: %w", rec.RunID, rec.Store, err)
	}
	in = runInput{
		Task:            &model.Task{ID: rec.TaskID, UserID: rec.UserID, ConversationID: rec.ConversationID},
		Run:             &model.TaskRun{ID: rec.RunID, TaskID: rec.TaskID},
		SessionID:       rec.SessionID,
		root:            h.layout.Root(),
		Paths:           h.paths(),
		Persist:         store,
		ArtifactStorage: store,
		Updater:         LogUpdater{Log: h.log},
		Journal:         jd,
		Logger:          h.log,
		AttestKey:       h.cfg.AttestKey,
		Version:         h.cfg.Version,
	}
	if cp := rec.ControlPlane; cp != nil && cp.URL != "" {
		// Recovery finishes the output stream too: the report follows it.
		c := workerclient.New(cp.URL, h.tokenFor(cp))
		in.Updater, in.StreamSender = c, c.Stream()
		if cp.Fence > 0 {
			lease := workerclient.Lease{RunID: rec.RunID, Epoch: cp.Fence, Token: cp.LeaseToken}
			c := workerclient.New(cp.URL, h.tokenFor(cp)).Fenced(lease)
			s := staleLeaseDone{c: c, log: h.log}
			in.Updater, in.StreamSender = s, s
			// The run's objects are written only while its lease holds:
			// renewed before each write, never over a run that ended or
			// that another worker holds now.
			fenced := fencedstore.New(store, store, renewBeforeWrite(c, lease), h.log.With("run", rec.RunID))
			in.Persist, in.ArtifactStorage = fenced, fenced
		}
	}
	return in, func() { store.Close() }, nil
}

// renewBeforeWrite is a recovered run's fencedstore.Confirm: it renews the
// run's journaled lease. A record without a lease token (journaled before
// leases had one) cannot be renewed: its lease is lost.
func renewBeforeWrite(c *workerclient.Client, l workerclient.Lease) fencedstore.Confirm {
	return func(ctx context.Context) error {
		if l.Token == "" {
			return fmt.Errorf("run %s: the journal holds no lease token: %w", l.RunID, workerclient.ErrLeaseLost)
		}
		_, err := c.RenewLease(ctx, l)
		return err
	}
}

// tokenFor finds a control plane's token again: the journaled variable or
// file, else Config.Token.
func (h *Host) tokenFor(cp *journal.ControlPlane) string {
	if cp.TokenEnv != "" {
		if v := os.Getenv(cp.TokenEnv); v != "" {
			return v
		}
	}
	if cp.TokenFile != "" {
		if data, err := os.ReadFile(cp.TokenFile); err == nil {
			return strings.TrimSpace(string(data))
		}
	}
	return h.cfg.Token
}

// recoverer recovers the root's runs whose executor is gone; containers
// may be nil when no engine is reachable.
func (h *Host) recoverer(jd *journal.Dir, containers recovery.Containers) *recovery.Recoverer {
	return &recovery.Recoverer{
		Journal:    jd,
		Log:        h.log,
		Containers: containers,
		Finish: func(ctx context.Context, rec journal.Record) error {
			ctx, cancel := context.WithTimeout(ctx, RecoverDeadline)
			defer cancel()
			in, closeFn, err := h.recoveryInput(ctx, rec)
			if err != nil {
				return err
			}
			defer closeFn()
			_, err = recoverRun(ctx, in, rec)
			return err
		},
	}
}

// RecoverRuns recovers (or with dryRun lists) the root's journaled runs
// whose executor is gone, and prints to out one line per run that is not
// live. d may be nil when Docker is unreachable: runs that still have a
// container then wait.
func (h *Host) RecoverRuns(ctx context.Context, d *docker.Backend, dryRun bool, out io.Writer) ([]recovery.Result, error) {
	var containers recovery.Containers
	if d != nil {
		containers = d
	}
	return h.recoverRuns(ctx, containers, dryRun, out)
}

// recoverRuns is RecoverRuns on the containers of any backend; containers
// is nil when none is reachable.
func (h *Host) recoverRuns(ctx context.Context, containers recovery.Containers, dryRun bool, out io.Writer) ([]recovery.Result, error) {
	jd, err := h.Journal()
	if err != nil {
		return nil, err
	}
	results, err := h.recoverer(jd, containers).Recover(ctx, dryRun)
	for _, res := range results {
		if res.Action == recovery.ActionNone {
			continue
		}
		verb := string(res.Action)
		if dryRun && res.Action == recovery.ActionRecovered {
			verb = "would recover"
		}
		fmt.Fprintf(out, "%s run %s (phase %s): %s\n", verb, res.RunID, res.Phase, strings.Join(strings.Fields(res.Why), " "))
	}
	return results, err
}

// RetryKeptRuns retries every kept run of the root once, prints one line
// per run to out, and returns how many are still kept.
func (h *Host) RetryKeptRuns(ctx context.Context, out io.Writer) (int, error) {
	jd, err := h.Journal()
	if err != nil {
		return 0, err
	}
	kept, err := recovery.Kept(jd)
	errs := []error{err}
	still := 0
	for _, rec := range kept {
		in, closeFn, err := h.recoveryInput(ctx, *rec)
		if err != nil {
			errs = append(errs, err)
			still++
			continue
		}
		res, err := retryPersist(ctx, in)
		closeFn()
		switch {
		case err == nil || (errors.Is(err, ErrRunFailed) && !stillKept(jd, rec.RunID)):
			status := model.StatusSucceeded
			if res != nil {
				status = res.Status
			}
			fmt.Fprintf(out, "stored run %s, reported %s\n", rec.RunID, status)
		default:
			still++
			errs = append(errs, fmt.Errorf("run %s: %w", rec.RunID, err))
			fmt.Fprintf(out, "kept run %s: %s\n", rec.RunID, strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " "))
		}
	}
	return still, errors.Join(errs...)
}

// stillKept reports whether the run's record is still in the journal.
func stillKept(jd *journal.Dir, runID string) bool {
	_, err := jd.Load(runID)
	return err == nil
}

// ReapOptions are the reaper's rules for this host: own and gone
// executors' containers, sparing those a recovery still needs.
func (h *Host) ReapOptions(grace time.Duration, all, dryRun bool, results []recovery.Result) docker.ReapOptions {
	return docker.ReapOptions{Grace: grace, All: all, DryRun: dryRun, ExecutorGone: h.ExecutorProcessGone, Spare: spared(results)}
}

// spared is the containers a recovery still needs: those of the runs it
// neither finished nor kept.
func spared(results []recovery.Result) []string {
	var spare []string
	for _, res := range results {
		if res.ContainerID != "" && res.Action != recovery.ActionRecovered && res.Action != recovery.ActionKept {
			spare = append(spare, res.ContainerID)
		}
	}
	return spare
}

// SweepPools removes the warm pool slots that gone executors left under
// the root (their containers are reaped with the rest), sparing the
// directories of journaled runs.
func (h *Host) SweepPools() error {
	jd, err := h.Journal()
	if err != nil {
		return err
	}
	recs, err := jd.List()
	if err != nil {
		return err
	}
	journaled := map[string]bool{}
	for _, r := range recs {
		journaled[r.RunDir], journaled[r.SpoolDir] = true, true
	}
	gone := func(id string) bool { g, _ := h.ExecutorGone(id); return g }
	removed, err := warmpool.Sweep(h.layout.PoolDir(), gone, func(path string) bool { return journaled[path] })
	for _, dir := range removed {
		h.log.Info("removed a gone executor's warm pool slot", "dir", dir)
	}
	return err
}

// SweepImages removes the disk cap images no run dir names any longer.
func (h *Host) SweepImages() error {
	removed, err := diskcap.SweepImages(h.layout.DiskCapImagesDir())
	for _, img := range removed {
		h.log.Info("removed a disk cap image no run dir names", "image", img)
	}
	return err
}

// RemoveGoneExecutors deletes the lock files of executors that are gone.
func (h *Host) RemoveGoneExecutors() {
	dir := h.layout.ExecutorsDir()
	infos, err := instance.List(dir)
	if err != nil {
		h.log.Warn("list executors", "err", err)
		return
	}
	for _, info := range infos {
		if _, err := instance.RemoveIfGone(dir, info.ID); err != nil {
			h.log.Warn("remove a gone executor's lock file", "executor", info.ID, "err", err)
		}
	}
}

// staleLeaseDone reports a leased run with its lease's fencing token. A
// control plane that refuses the lease (412 stale, 403 not this worker's)
// has finalized the run itself ("worker lost") or given it to another
// worker: there is nothing left to report, so the refusal ends the run's
// recovery rather than keeping it.
type staleLeaseDone struct {
	c   *workerclient.Client
	log *slog.Logger
}

// UpdateRunStatus implements TaskRunUpdater.
func (s staleLeaseDone) UpdateRunStatus(ctx context.Context, runID string, req *workerclient.PatchTaskRunRequest) error {
	err := s.c.UpdateRunStatus(ctx, runID, req)
	if fencedstore.Lost(err) {
		s.log.Info("the control plane no longer holds this worker's lease on the run; not reporting it", "run", runID, "status", req.Status)
		return nil
	}
	return err
}

// Send implements workerclient.StreamSender: a refused fence drops the
// output, which is no longer this worker's to deliver.
func (s staleLeaseDone) Send(ctx context.Context, runID string, d workerclient.Delta) error {
	if err := s.c.Stream().Send(ctx, runID, d); !fencedstore.Lost(err) {
		return err
	}
	return nil
}

// End implements workerclient.StreamSender, as Send does.
func (s staleLeaseDone) End(ctx context.Context, runID string, total int64) error {
	if err := s.c.Stream().End(ctx, runID, total); !fencedstore.Lost(err) {
		return err
	}
	return nil
}

// LogUpdater is the TaskRunUpdater of a run without a control plane: it
// logs each status.
type LogUpdater struct{ Log *slog.Logger }

// UpdateRunStatus implements TaskRunUpdater.
func (u LogUpdater) UpdateRunStatus(_ context.Context, runID string, req *workerclient.PatchTaskRunRequest) error {
	attrs := []any{"run", runID, "status", req.Status}
	if req.Container != nil {
		attrs = append(attrs, "container", shortID(req.Container.ID))
	}
	if req.ExitCode != nil {
		attrs = append(attrs, "exit_code", *req.ExitCode)
	}
	if req.Error != nil {
		attrs = append(attrs, "reason", *req.Error)
	}
	u.Log.Info("run status", attrs...)
	return nil
}

// shortID is a container ID's first 12 characters, as docker shows it.
func shortID(id string) string { return id[:min(len(id), 12)] }
