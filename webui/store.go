package webui

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
)

// DefaultListLimit caps a run list whose filter sets no limit.
const DefaultListLimit = 200

// storePoll is how often FollowOutput looks again at a running run that has
// no live stream here (its output reaches the store when it ends).
const storePoll = time.Second

// StoreSource reads runs from a blob store's run index (package runindex),
// and the output of running runs from Live when set. It keeps no data about
// worker hosts.
type StoreSource struct {
	Store *persist.Store
	// Live, when set, holds the output streams of running runs.
	Live *Streams
}

var _ Source = (*StoreSource)(nil)

// Runs lists the indexed runs matching f, newest first.
func (s *StoreSource) Runs(ctx context.Context, f Filter) ([]Run, error) {
	if f.Limit <= 0 {
		f.Limit = DefaultListLimit
	}
	recs, err := runindex.List(ctx, s.Store, runindex.Filter{UserID: f.Tenant, TaskID: f.Task, Status: f.Status, Limit: f.Limit})
	if err != nil {
		return nil, err
	}
	out := make([]Run, len(recs))
	for i, r := range recs {
		out[i] = runOf(r)
	}
	return out, nil
}

// Run returns the newest index record of run id.
func (s *StoreSource) Run(ctx context.Context, id string) (Run, error) {
	rec, err := runindex.Find(ctx, s.Store, id, "")
	if errors.Is(err, runindex.ErrNotFound) {
		return Run{}, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if err != nil {
		return Run{}, err
	}
	return runOf(*rec), nil
}

// FollowOutput follows the live stream while there is one, else the stored
// output log once the run has ended.
func (s *StoreSource) FollowOutput(ctx context.Context, id string, offset int64, max int) (Chunk, error) {
	for {
		if s.Live != nil {
			c, ok, err := s.Live.Follow(ctx, id, offset, max)
			if ok || err != nil {
				return c, err
			}
		}
		run, err := s.Run(ctx, id)
		if err != nil {
			return Chunk{}, err
		}
		if !run.Status.Live() {
			return s.storedOutput(ctx, run, offset, max)
		}
		t := time.NewTimer(storePoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return Chunk{}, ctx.Err()
		}
	}
}

// storedOutput reads the stored log of an ended run from offset on.
func (s *StoreSource) storedOutput(ctx context.Context, run Run, offset int64, max int) (Chunk, error) {
	rc, err := runindex.OpenLog(ctx, s.Store, &run.Record, false)
	if errors.Is(err, runindex.ErrNoObject) {
		return Chunk{Offset: offset, Ended: true}, nil
	}
	if err != nil {
		return Chunk{}, err
	}
	defer rc.Close()
	skipped, err := io.CopyN(io.Discard, rc, offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return Chunk{}, err
	}
	buf := make([]byte, max)
	n, err := io.ReadFull(rc, buf)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return Chunk{}, err
	}
	ended := n < max
	if !ended {
		var one [1]byte
		m, _ := rc.Read(one[:])
		ended = m == 0
	}
	return Chunk{Offset: skipped, Data: buf[:n], Ended: ended}, nil
}

// OpenObject opens one of the run's stored records.
func (s *StoreSource) OpenObject(ctx context.Context, id string, o Object) (io.ReadCloser, error) {
	run, err := s.Run(ctx, id)
	if err != nil {
		return nil, err
	}
	return openObject(ctx, s.Store, &run.Record, o)
}

// openObject opens one of the records rec names in store.
func openObject(ctx context.Context, store *persist.Store, rec *runindex.Record, o Object) (io.ReadCloser, error) {
	key := ""
	switch o {
	case ObjectLog:
		key = rec.Keys.Log
	case ObjectPatch:
		key = rec.Keys.Patch
	case ObjectChanges:
		key = rec.Keys.Changes
	case ObjectAudit:
		key = rec.Keys.Audit
	case ObjectTrace:
		key = rec.Keys.Trace
	case ObjectGateway:
		if rec.SessionID != "" {
			p, err := persist.GatewayRecordPath(rec.SessionID, rec.RunID)
			if err != nil {
				return nil, err
			}
			key, _ = persist.GlobalKey(rec.UserID, p)
		}
	case ObjectEgress:
		key, _ = persist.RunKey(rec.Ref(), egress.RecordName)
	default:
		return nil, fmt.Errorf("webui: unknown run object %q", o)
	}
	if key == "" || store == nil {
		return nil, fmt.Errorf("%w: run %s has no %s", ErrNoObject, rec.RunID, o)
	}
	tenant, err := persist.TenantPrefix(rec.UserID)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(key, tenant) {
		return nil, fmt.Errorf("webui: run %s names its %s at %q, outside its tenant", rec.RunID, o, key)
	}
	rc, err := store.Open(ctx, key)
	if errors.Is(err, persist.ErrNotFound) {
		return nil, fmt.Errorf("%w: run %s has no %s", ErrNoObject, rec.RunID, o)
	}
	return rc, err
}

// Artifacts lists the artifacts the run's record says it stored.
func (s *StoreSource) Artifacts(ctx context.Context, id string) ([]Artifact, error) {
	run, err := s.Run(ctx, id)
	if err != nil {
		return nil, err
	}
	return artifactsOf(run.Record)
}

func artifactsOf(rec runindex.Record) ([]Artifact, error) {
	prefix, err := persist.RunPrefix(rec.Ref())
	if err != nil {
		return nil, err
	}
	prefix += "artifacts/"
	var out []Artifact
	for _, o := range rec.Stored {
		if p, ok := strings.CutPrefix(o.Key, prefix); ok {
			out = append(out, Artifact{Path: p, Size: o.Size, SHA256: o.SHA256, ContentType: o.ContentType})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// OpenArtifact opens one artifact the run's record lists.
func (s *StoreSource) OpenArtifact(ctx context.Context, id, path string) (io.ReadCloser, error) {
	run, err := s.Run(ctx, id)
	if err != nil {
		return nil, err
	}
	return openArtifact(ctx, s.Store, run.Record, path)
}

// openArtifact opens the artifact path of rec, which must list it.
func openArtifact(ctx context.Context, store *persist.Store, rec runindex.Record, path string) (io.ReadCloser, error) {
	arts, err := artifactsOf(rec)
	if err != nil {
		return nil, err
	}
	for _, a := range arts {
		if a.Path == path && store != nil {
			return store.OpenArtifact(ctx, rec.Ref(), path)
		}
	}
	return nil, fmt.Errorf("%w: run %s has no artifact %q", ErrNotFound, rec.RunID, path)
}

// Hosts: a blob store knows nothing of worker hosts.
func (s *StoreSource) Hosts(context.Context) ([]Host, error) {
	return nil, ErrNoHosts
}
