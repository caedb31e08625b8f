package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/fencedstore"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/recovery"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/warmpool"
	"github.com/taskrun/taskrun/workerclient"
)

// envToken is the environment variable --token falls back to. A run
// journals its name (never the token), so `taskrun gc` and `taskrun persist
// --all` can report to the run's control plane with the same variable set.
const envToken = "TASKRUN_TOKEN"

// recoverDeadline bounds each recovered run's storing and reporting.
const recoverDeadline = taskrun.DefaultPersistTimeout + taskrun.DefaultReportTimeout

// hostState is what gc, persist --all and run share to find the runs and
// executors of a runs root.
type hostState struct {
	root    string
	journal *journal.Dir
	log     *slog.Logger
	// token is --token, for runs whose control plane needs one that was not
	// journaled by variable name.
	token string
	// attestKey signs the attestations of the runs finished here; nil
	// leaves them unsigned.
	attestKey *attest.Signer
}

func openHostState(root, token string, log *slog.Logger) (*hostState, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("--root: %w", err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("--root: %w", err)
	}
	jd, err := taskrun.OpenRunJournal(root)
	if err != nil {
		return nil, err
	}
	return &hostState{root: root, journal: jd, log: log, token: token}, nil
}

// executorsDir is where executor instances keep their lock files.
func (h *hostState) executorsDir() string { return filepath.Join(h.root, taskrun.ExecutorsDirName) }

// executorGone proves an executor gone by its instance lock.
func (h *hostState) executorGone(id string) (bool, string) {
	gone, why, err := instance.Gone(h.executorsDir(), instance.Info{ID: id})
	if err != nil {
		return false, err.Error()
	}
	return gone, why
}

// executorProcessGone is executorGone for a container that may carry its
// executor's process record: an executor that exited cleanly removed its
// lock file, and the record then proves it gone.
func (h *hostState) executorProcessGone(id, process string) (bool, string) {
	gone, why, err := instance.Gone(h.executorsDir(), instance.ParseProcess(id, process))
	if err != nil {
		return false, err.Error()
	}
	return gone, why
}

// input is the RunTaskInput that names a journaled run, with its store and
// control plane opened from the record; close releases them.
func (h *hostState) input(ctx context.Context, rec journal.Record) (in taskrun.RunTaskInput, closeFn func(), err error) {
	store, err := persist.Open(ctx, rec.Store)
	if err != nil {
		return in, nil, fmt.Errorf("run %s: store %s: %w", rec.RunID, rec.Store, err)
	}
	in = taskrun.RunTaskInput{
		Task:            &model.Task{ID: rec.TaskID, UserID: rec.UserID, ConversationID: rec.ConversationID},
		Run:             &model.TaskRun{ID: rec.RunID, TaskID: rec.TaskID},
		SessionID:       rec.SessionID,
		Paths:           taskrun.NewRuntimePathsFromRoot(h.root),
		Persist:         store,
		ArtifactStorage: store,
		Updater:         logUpdater{log: h.log},
		Journal:         h.journal,
		Logger:          h.log,
		AttestKey:       h.attestKey,
		Version:         version,
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
// file, else --token.
func (h *hostState) tokenFor(cp *journal.ControlPlane) string {
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
	return h.token
}

// recoverer recovers the root's runs whose executor is gone; backend may be
// nil when Docker is unreachable.
func (h *hostState) recoverer(backend *docker.Backend) *recovery.Recoverer {
	r := &recovery.Recoverer{
		Journal: h.journal,
		Log:     h.log,
		Finish: func(ctx context.Context, rec journal.Record) error {
			ctx, cancel := context.WithTimeout(ctx, recoverDeadline)
			defer cancel()
			in, closeFn, err := h.input(ctx, rec)
			if err != nil {
				return err
			}
			defer closeFn()
			_, err = taskrun.RecoverRun(ctx, in, rec)
			return err
		},
	}
	if backend != nil {
		r.Containers = backend
	}
	return r
}

// recoverRuns recovers (or with dryRun lists) the root's journaled runs and
// prints one line per run that is not live.
func (h *hostState) recoverRuns(ctx context.Context, backend *docker.Backend, dryRun bool, out io.Writer) ([]recovery.Result, error) {
	results, err := h.recoverer(backend).Recover(ctx, dryRun)
	for _, res := range results {
		if res.Action == recovery.ActionNone {
			continue
		}
		verb := string(res.Action)
		if dryRun && res.Action == recovery.ActionRecovered {
			verb = "would recover"
		}
		fmt.Fprintf(out, "%s run %s (phase %s): %s\n", verb, res.RunID, res.Phase, oneLineStr(res.Why))
	}
	return results, err
}

// retryKept retries every kept run of the root once and returns how many
// are still kept.
func (h *hostState) retryKept(ctx context.Context, out io.Writer) (int, error) {
	kept, err := recovery.Kept(h.journal)
	errs := []error{err}
	still := 0
	for _, rec := range kept {
		in, closeFn, err := h.input(ctx, *rec)
		if err != nil {
			errs = append(errs, err)
			still++
			continue
		}
		res, err := taskrun.RetryPersist(ctx, in)
		closeFn()
		switch {
		case err == nil || (errors.Is(err, taskrun.ErrRunFailed) && !stillKept(h.journal, rec.RunID)):
			status := model.StatusSucceeded
			if res != nil {
				status = res.Status
			}
			fmt.Fprintf(out, "stored run %s, reported %s\n", rec.RunID, status)
		default:
			still++
			errs = append(errs, fmt.Errorf("run %s: %w", rec.RunID, err))
			fmt.Fprintf(out, "kept run %s: %s\n", rec.RunID, oneLine(err))
		}
	}
	return still, errors.Join(errs...)
}

// stillKept reports whether the run's record is still in the journal.
func stillKept(d *journal.Dir, runID string) bool {
	_, err := d.Load(runID)
	return err == nil
}

// reapOptions are the reaper's rules for this host: own and gone executors'
// containers, sparing those a recovery still needs.
func (h *hostState) reapOptions(grace time.Duration, all, dryRun bool, results []recovery.Result) docker.ReapOptions {
	opts := docker.ReapOptions{Grace: grace, All: all, DryRun: dryRun, ExecutorGone: h.executorProcessGone}
	for _, res := range results {
		if res.ContainerID != "" && res.Action != recovery.ActionRecovered && res.Action != recovery.ActionKept {
			opts.Spare = append(opts.Spare, res.ContainerID)
		}
	}
	return opts
}

// sweepPools removes the warm pool slots that gone executors left under
// the root (their containers are reaped with the rest), sparing the
// directories of journaled runs.
func (h *hostState) sweepPools() error {
	recs, err := h.journal.List()
	if err != nil {
		return err
	}
	journaled := map[string]bool{}
	for _, r := range recs {
		journaled[r.RunDir], journaled[r.SpoolDir] = true, true
	}
	gone := func(id string) bool { g, _ := h.executorGone(id); return g }
	removed, err := warmpool.Sweep(taskrun.PoolDir(h.root), gone, func(path string) bool { return journaled[path] })
	for _, dir := range removed {
		h.log.Info("removed a gone executor's warm pool slot", "dir", dir)
	}
	return err
}

// sweepImages removes the disk cap images no run dir names any longer.
func (h *hostState) sweepImages() error {
	removed, err := diskcap.SweepImages(filepath.Join(taskrun.DiskCapTemplatesDir(h.root), diskcap.ImagesDirName))
	for _, img := range removed {
		h.log.Info("removed a disk cap image no run dir names", "image", img)
	}
	return err
}

// removeGoneExecutors deletes the lock files of executors that are gone.
func (h *hostState) removeGoneExecutors() {
	infos, err := instance.List(h.executorsDir())
	if err != nil {
		h.log.Warn("list executors", "err", err)
		return
	}
	for _, info := range infos {
		if _, err := instance.RemoveIfGone(h.executorsDir(), info.ID); err != nil {
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

// UpdateRunStatus implements taskrun.TaskRunUpdater.
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

// oneLineStr flattens a multi-line message.
func oneLineStr(s string) string { return strings.Join(strings.Fields(s), " ") }
