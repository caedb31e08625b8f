package webui

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
)

// DefaultFollowPoll is how often ControlPlaneSource looks for more output of
// a running run.
const DefaultFollowPoll = 250 * time.Millisecond

// ControlPlaneSource reads runs as the control plane records them (status,
// lease, what its worker reported, the output stream it received) and their
// stored records from the blob store workers persist runs to.
type ControlPlaneSource struct {
	// Control is the control plane's store.
	Control controlplane.RunReader
	// Store is the shared blob store; nil: the runs' records are not shown.
	Store *persist.Store
	// Poll is how often a follower looks for more output (0: DefaultFollowPoll).
	Poll time.Duration
	// Workers lists the workers' heartbeats (their last lease requests);
	// nil: hosts are known only by the leases they hold.
	Workers controlplane.WorkerReader
	// Now is the clock of the hosts page's window (nil: time.Now).
	Now func() time.Time
	// LiveUsage, when set, is a RUNNING run's resource usage at its last
	// live sample (nil: none yet), shown until its record has the final
	// figures.
	LiveUsage func(ctx context.Context, r controlplane.Run) (*sandbox.Usage, error)

	// usage holds each run's live usage for liveUsageFresh: one page asks
	// for its run more than once.
	usageMu sync.Mutex
	usage   map[string]liveSample
}

// liveSample is a run's live usage and when it was asked for.
type liveSample struct {
	u  *sandbox.Usage
	at time.Time
}

// liveUsageFresh is how long a live usage answer is shown again.
const liveUsageFresh = time.Second

// liveUsage is r's live usage, asked at most once per liveUsageFresh.
func (s *ControlPlaneSource) liveUsage(ctx context.Context, r controlplane.Run) *sandbox.Usage {
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	now := time.Now()
	if c, ok := s.usage[r.ID]; ok && now.Sub(c.at) < liveUsageFresh {
		return c.u
	}
	for id, c := range s.usage {
		if now.Sub(c.at) >= liveUsageFresh {
			delete(s.usage, id)
		}
	}
	// Best effort: a worker that does not answer leaves it unsampled.
	u, err := s.LiveUsage(ctx, r)
	if err != nil {
		u = nil
	}
	if s.usage == nil {
		s.usage = map[string]liveSample{}
	}
	s.usage[r.ID] = liveSample{u: u, at: now}
	return u
}

var _ Source = (*ControlPlaneSource)(nil)

// fromControlPlane is the interface's view of a control-plane run.
func fromControlPlane(r controlplane.Run) Run {
	rec := runindex.Record{
		RunID:          r.ID,
		UserID:         r.Task.UserID,
		ConversationID: r.Task.ConversationID,
		TaskID:         r.Task.ID,
		SessionID:      r.SessionID,
		ParentRunID:    r.ParentRunID,
		Status:         r.Status,
		Reason:         r.Error,
		Start:          r.CreatedAt,
		ExitCode:       r.ExitCode,
		Image:          r.Spec.Image,
	}
	if r.StartedAt != nil {
		rec.Start = *r.StartedAt
	}
	if r.EndedAt != nil {
		rec.End = *r.EndedAt
		rec.DurationMS = rec.End.Sub(rec.Start).Milliseconds()
	}
	if r.PromptTokens > 0 || r.CompletionTokens > 0 {
		p, c := int(r.PromptTokens), int(r.CompletionTokens)
		rec.PromptTokens, rec.CompletionTokens = &p, &c
	}
	if c := r.Container; c != nil {
		rec.ContainerID, rec.ImageDigest, rec.Runtime = c.ID, c.ImageDigest, c.Runtime
	}
	if rec.Runtime == "" {
		rec.Runtime = r.Spec.Runtime
	}
	return Run{Record: rec, Worker: r.WorkerID}
}

// Runs lists the control plane's runs matching f, newest first.
func (s *ControlPlaneSource) Runs(ctx context.Context, f Filter) ([]Run, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	fetch := limit
	if f.Task != "" {
		fetch = controlplane.MaxListLimit // the store filters by tenant and status only
	}
	runs, err := s.Control.ListRuns(ctx, controlplane.RunFilter{UserID: f.Tenant, Status: f.Status, Limit: fetch})
	if err != nil {
		return nil, err
	}
	var out []Run
	for _, r := range runs {
		if f.Task != "" && r.Task.ID != f.Task {
			continue
		}
		out = append(out, fromControlPlane(r))
		if len(out) >= limit {
			break
		}
	}
	return out, nil
}

// Run returns the run as the control plane records it, with the keys,
// stored objects and isolation verdict of its index record when the store
// holds one.
func (s *ControlPlaneSource) Run(ctx context.Context, id string) (Run, error) {
	r, err := s.Control.GetRun(ctx, id)
	if errors.Is(err, controlplane.ErrNotFound) {
		return Run{}, fmt.Errorf("%w: no run %s: %w", ErrNotFound, id, err)
	}
	if err != nil {
		return Run{}, err
	}
	run := fromControlPlane(r)
	if s.LiveUsage != nil && r.Status == model.StatusRunning {
		if u := s.liveUsage(ctx, r); u != nil {
			run.Record.Usage = u
		}
	}
	if s.Store == nil {
		return run, nil
	}
	idx, err := runindex.Find(ctx, s.Store, id, run.UserID)
	switch {
	case errors.Is(err, runindex.ErrNotFound):
		return run, nil // not persisted (yet)
	case err != nil:
		return run, err
	}
	if idx.ConversationID != run.ConversationID || idx.TaskID != run.TaskID {
		return run, fmt.Errorf("webui: the store's record of run %s names another task (%s/%s)", id, idx.ConversationID, idx.TaskID)
	}
	rec := &run.Record
	rec.Keys, rec.Stored, rec.Changes, rec.Execs = idx.Keys, idx.Stored, idx.Changes, idx.Execs
	rec.Isolation, rec.Limits, rec.Host, rec.ContainerName = idx.Isolation, idx.Limits, idx.Host, idx.ContainerName
	rec.Timings, run.Phases = idx.Timings, phasesOf(idx.Timings)
	if idx.Usage != nil || rec.Usage == nil {
		rec.Usage = idx.Usage
	}
	if rec.Image == "" {
		rec.Image = idx.Image
	}
	if rec.ImageDigest == "" {
		rec.ImageDigest = idx.ImageDigest
	}
	return run, nil
}

// FollowOutput reads the output stream the control plane received, waiting
// for more while the run may still write.
func (s *ControlPlaneSource) FollowOutput(ctx context.Context, id string, offset int64, max int) (Chunk, error) {
	poll := s.Poll
	if poll <= 0 {
		poll = DefaultFollowPoll
	}
	for {
		data, r, err := s.Control.ReadOutput(ctx, id, offset, max)
		if errors.Is(err, controlplane.ErrNotFound) {
			return Chunk{}, fmt.Errorf("%w: no run %s: %w", ErrNotFound, id, err)
		}
		if err != nil {
			return Chunk{}, err
		}
		end := offset + int64(len(data))
		// A run that ended without ending its stream (its worker was
		// lost) writes nothing more either.
		done := r.StreamEnded || r.Status.Terminal()
		if len(data) > 0 || done {
			return Chunk{Offset: offset, Data: data, Ended: done && end >= r.StreamNext}, nil
		}
		t := time.NewTimer(poll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return Chunk{}, ctx.Err()
		}
	}
}

// OpenObject opens one of the run's stored records.
func (s *ControlPlaneSource) OpenObject(ctx context.Context, id string, o Object) (io.ReadCloser, error) {
	run, err := s.Run(ctx, id)
	if err != nil {
		return nil, err
	}
	return openObject(ctx, s.Store, &run.Record, o)
}

// Artifacts lists the artifacts the run stored.
func (s *ControlPlaneSource) Artifacts(ctx context.Context, id string) ([]Artifact, error) {
	run, err := s.Run(ctx, id)
	if err != nil {
		return nil, err
	}
	return artifactsOf(run.Record)
}

// OpenArtifact opens one artifact the run stored.
func (s *ControlPlaneSource) OpenArtifact(ctx context.Context, id, path string) (io.ReadCloser, error) {
	run, err := s.Run(ctx, id)
	if err != nil {
		return nil, err
	}
	return openArtifact(ctx, s.Store, run.Record, path)
}

// Hosts lists the workers that asked for work within
// controlplane.WorkerListWindow, with their last reported capacity, labels
// and heartbeat, and the workers holding leases on running runs. Without
// Workers, or for a lease holder it has no heartbeat of, a host is not
// Reported.
func (s *ControlPlaneSource) Hosts(ctx context.Context) ([]Host, error) {
	runs, err := s.Control.ListRuns(ctx, controlplane.RunFilter{Status: "RUNNING", Limit: controlplane.MaxListLimit})
	if err != nil {
		return nil, err
	}
	byID := map[string]*Host{}
	var ids []string
	host := func(id string) *Host {
		h, ok := byID[id]
		if !ok {
			h = &Host{ID: id, WarmPool: -1}
			byID[id] = h
			ids = append(ids, id)
		}
		return h
	}
	if s.Workers != nil {
		now := time.Now
		if s.Now != nil {
			now = s.Now
		}
		workers, err := s.Workers.ListWorkers(ctx, now().Add(-controlplane.WorkerListWindow))
		if err != nil {
			return nil, err
		}
		for _, w := range workers {
			h := host(w.ID)
			h.Reported, h.LastHeartbeat = true, w.LastSeen
			h.Slots, h.FreeSlots = w.Capacity.Slots, w.Capacity.FreeSlots
			h.FreeMemoryBytes, h.FreeDiskBytes = w.Capacity.FreeMemoryBytes, w.Capacity.FreeDiskBytes
			h.Labels = workerLabels(w.Labels)
		}
	}
	for _, r := range runs {
		if r.WorkerID == "" {
			continue
		}
		h := host(r.WorkerID)
		h.Leases = append(h.Leases, Lease{RunID: r.ID, Tenant: r.Task.UserID})
		if r.LeaseExpiresAt != nil && r.LeaseExpiresAt.After(h.LeaseExpires) {
			h.LeaseExpires = *r.LeaseExpiresAt
		}
	}
	sort.Strings(ids)
	out := make([]Host, len(ids))
	for i, id := range ids {
		out[i] = *byID[id]
	}
	return out, nil
}

// workerLabels is the hosts page's view of what a worker advertised.
func workerLabels(l workerclient.WorkerLabels) map[string]string {
	m := map[string]string{}
	if len(l.Runtimes) > 0 {
		m["runtimes"] = strings.Join(l.Runtimes, ",")
	}
	if len(l.Images) > 0 {
		m["images"] = strings.Join(l.Images, ",")
	}
	if l.Backend != "" {
		m["backend"] = l.Backend
	}
	if l.CanPull {
		m["can_pull"] = "true"
	}
	return m
}
