// Package runindex keeps one small record per run in the store, next to the
// run's objects, and reads runs back through it: listing (newest first,
// filtered), finding a run by ID, and opening its log, patch and files.
//
// The executor writes a run's Record with Put when it persists the run; the
// CLI's runs, logs, diff, apply, cp and inspect commands read with List,
// Find and Open*. Listing reads only the tenants' index prefixes
// (persist.IndexKey), never the whole bucket.
package runindex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// RecordVersion is the version of the Record layout this package writes.
const RecordVersion = 1

// maxRecordBytes bounds a record read back from the store.
const maxRecordBytes = 4 << 20

// ErrNotFound is wrapped when no indexed run matches.
var ErrNotFound = errors.New("runindex: run not found")

// ErrAmbiguous is wrapped when a run ID names runs of several tenants.
var ErrAmbiguous = errors.New("runindex: run ID is ambiguous")

// Keys names a run's well-known objects by their store keys; an empty key
// means the run stored no such object.
type Keys struct {
	Log     string `json:"log,omitempty"`
	Stderr  string `json:"stderr,omitempty"`
	Patch   string `json:"patch,omitempty"`
	Changes string `json:"changes,omitempty"`
	State   string `json:"state,omitempty"`
	Audit   string `json:"audit,omitempty"`
	Trace   string `json:"trace,omitempty"`
}

// Changes summarises a run's change set in its record.
type Changes struct {
	BaseCommit string            `json:"base_commit,omitempty"`
	TreeHash   string            `json:"tree_hash,omitempty"`
	Summary    changeset.Summary `json:"summary"`
}

// Exec records one command run inside a live run's container.
type Exec struct {
	By      string    `json:"by"`
	At      time.Time `json:"at"`
	Command []string  `json:"command"`
	Exit    int       `json:"exit"`
}

// Record is a run's entry in the index: who, what, how it ended, where its
// objects are.
type Record struct {
	Version        int    `json:"version"`
	RunID          string `json:"run_id"`
	UserID         string `json:"user_id"`
	ConversationID string `json:"conversation_id"`
	TaskID         string `json:"task_id"`
	SessionID      string `json:"session_id,omitempty"`
	// ParentRunID names the run this run was forked from, if it was.
	ParentRunID string          `json:"parent_run_id,omitempty"`
	Status      model.RunStatus `json:"status"`
	Reason      string          `json:"reason,omitempty"`
	Start       time.Time       `json:"start"`
	End         time.Time       `json:"end,omitzero"`
	DurationMS  int64           `json:"duration_ms"`
	ExitCode    *int            `json:"exit_code,omitempty"`
	// PromptTokens and CompletionTokens are the gateway's metered usage.
	PromptTokens     *int   `json:"prompt_tokens,omitempty"`
	CompletionTokens *int   `json:"completion_tokens,omitempty"`
	Image            string `json:"image,omitempty"`
	ImageDigest      string `json:"image_digest,omitempty"`
	Runtime          string `json:"runtime,omitempty"`
	ContainerID      string `json:"container_id,omitempty"`
	ContainerName    string `json:"container_name,omitempty"`
	// Host is the executor host's name, for following a live run's log.
	Host string `json:"host,omitempty"`
	// Limits are the sandbox limits the run had, as the executor reports them.
	Limits map[string]any `json:"limits,omitempty"`
	// Isolation is the isolation verdict ("verified", or why not).
	Isolation string               `json:"isolation,omitempty"`
	Keys      Keys                 `json:"keys"`
	Stored    []persist.ObjectInfo `json:"stored,omitempty"`
	Changes   *Changes             `json:"changes,omitempty"`
	Execs     []Exec               `json:"execs,omitempty"`
	// Timings are the run's phases as the executor timed them, in order of
	// their start (package timings); the last ones (the index write itself
	// and the journal's end) come after the record was written.
	Timings []timings.Span `json:"timings,omitempty"`
	// Usage is what the run's container used, as its backend sampled it
	// (added in version 1 as an optional field: a record without it reads
	// as nil, and readers that predate it ignore it); nil while the run
	// is live, and for a backend that samples none.
	Usage *sandbox.Usage `json:"usage,omitempty"`
	// Checkpoint is the stored checkpoint of a PAUSED run, with its
	// archive's digest: what a resume on any host with the store checks
	// the archive against (added in version 1 as an optional field).
	Checkpoint *checkpoint.Manifest `json:"checkpoint,omitempty"`
}

// Ref returns the record's run reference.
func (r *Record) Ref() persist.RunRef {
	return persist.RunRef{UserID: r.UserID, ConversationID: r.ConversationID, TaskID: r.TaskID, RunID: r.RunID}
}

// Writer stores index objects; *persist.Store is one.
type Writer interface {
	PutIndex(ctx context.Context, ref persist.RunRef, start time.Time, doc []byte) (persist.ObjectInfo, error)
}

var _ Writer = (*persist.Store)(nil)

// Put stores rec as its run's index object, replacing an earlier version
// (same run and start).
func Put(ctx context.Context, store Writer, rec *Record) (persist.ObjectInfo, error) {
	if rec.Version == 0 {
		rec.Version = RecordVersion
	}
	if !rec.End.IsZero() && rec.DurationMS == 0 {
		rec.DurationMS = rec.End.Sub(rec.Start).Milliseconds()
	}
	doc, err := json.Marshal(rec)
	if err != nil {
		return persist.ObjectInfo{}, fmt.Errorf("runindex: encode record of %s: %w", rec.RunID, err)
	}
	info, err := store.PutIndex(ctx, rec.Ref(), rec.Start, doc)
	if err != nil {
		return persist.ObjectInfo{}, fmt.Errorf("runindex: store record of %s: %w", rec.RunID, err)
	}
	return info, nil
}

// Filter selects runs for List; empty fields match everything.
type Filter struct {
	UserID string
	TaskID string
	Status model.RunStatus
	// Limit > 0 stops after that many matching runs.
	Limit int
}

// List returns the indexed runs matching f, newest first. It reads index
// records one by one, newest first, and stops at f.Limit matches.
func List(ctx context.Context, store *persist.Store, f Filter) ([]Record, error) {
	if f.UserID != "" {
		if err := model.ValidateID("user", f.UserID); err != nil {
			return nil, err
		}
	}
	entries, err := store.ListIndex(ctx, f.UserID, 0)
	if err != nil {
		return nil, fmt.Errorf("runindex: list: %w", err)
	}
	var out []Record
	for _, e := range entries {
		rec, err := read(ctx, store, e)
		if err != nil {
			return nil, err
		}
		if (f.TaskID != "" && rec.TaskID != f.TaskID) || (f.Status != "" && !strings.EqualFold(string(rec.Status), string(f.Status))) {
			continue
		}
		out = append(out, *rec)
		if f.Limit > 0 && len(out) >= f.Limit {
			break
		}
	}
	return out, nil
}

// Find returns the record of runID, searched in userID's index or, with
// userID "", in every tenant's. A run ID used by runs of several tenants
// is refused with ErrAmbiguous; name the user then.
func Find(ctx context.Context, store *persist.Store, runID, userID string) (*Record, error) {
	if err := model.ValidateID("run", runID); err != nil {
		return nil, err
	}
	entries, err := store.ListIndex(ctx, userID, 0)
	if err != nil {
		return nil, fmt.Errorf("runindex: find %s: %w", runID, err)
	}
	var found *persist.IndexEntry
	for i, e := range entries {
		if e.RunID != runID {
			continue
		}
		if found != nil && found.UserID != e.UserID {
			return nil, fmt.Errorf("%w: %s is a run of users %s and %s: pass --user", ErrAmbiguous, runID, found.UserID, e.UserID)
		}
		if found == nil {
			found = &entries[i] // newest first: the latest record of the run
		}
	}
	if found == nil {
		where := "any user's"
		if userID != "" {
			where = "user " + userID + "'s"
		}
		return nil, fmt.Errorf("%w: no run %s in %s index: list runs with `taskrun runs`", ErrNotFound, runID, where)
	}
	return read(ctx, store, *found)
}

// read loads and checks the record e names.
func read(ctx context.Context, store *persist.Store, e persist.IndexEntry) (*Record, error) {
	rc, err := store.Open(ctx, e.Key)
	if err != nil {
		return nil, fmt.Errorf("runindex: read %s: %w", e.Key, err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, maxRecordBytes+1))
	if err != nil {
		return nil, fmt.Errorf("runindex: read %s: %w", e.Key, err)
	}
	if len(raw) > maxRecordBytes {
		return nil, fmt.Errorf("runindex: record %s is over %d bytes", e.Key, maxRecordBytes)
	}
	var rec Record
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("runindex: decode %s: %w", e.Key, err)
	}
	if rec.UserID != e.UserID || rec.RunID != e.RunID {
		return nil, fmt.Errorf("runindex: record %s names run %s of user %s, not the run its key names", e.Key, rec.RunID, rec.UserID)
	}
	return &rec, nil
}
