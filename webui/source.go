// Package webui is taskrun's web interface: the list of runs, one
// run's output (live while it runs), change set, artifacts, trace, model
// exchanges, egress record and isolation record, the rule table the audit
// checks, and the worker hosts. It renders plain HTML with html/template,
// serves its one script and stylesheet from an embedded file system, and
// follows live output over server-sent events.
//
// Everything a run holds was written by a hostile agent: every value is
// escaped for its HTML context, terminal escapes are neutralized (termsafe)
// before they reach the page, the Content-Security-Policy allows no inline
// script, and artifacts are only ever downloaded, never rendered.
//
// With Options.Actions a signed-in user also submits tasks and cancels their
// own runs, with forms guarded against cross-site request forgery.
//
// The interface reads through a Source; StoreSource reads the run index of
// a blob store (package runindex) and, with a Streams, the live output of
// running runs.
package webui

import (
	"cmp"
	"context"
	"errors"
	"io"
	"slices"
	"time"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/timings"
)

// Errors a Source wraps.
var (
	// ErrNotFound: no such run or artifact.
	ErrNotFound = errors.New("webui: not found")
	// ErrNoObject: the run stored no object of the kind asked for.
	ErrNoObject = errors.New("webui: the run stored no such object")
	// ErrNoHosts: the source keeps no data about worker hosts.
	ErrNoHosts = errors.New("webui: this control plane keeps no worker host data")
)

// Object names one of the records a run stores.
type Object string

// The records of a run the interface shows.
const (
	ObjectLog     Object = "output.log"
	ObjectPatch   Object = "changes.patch"
	ObjectChanges Object = "changes.json"
	ObjectAudit   Object = "audit.json"
	ObjectTrace   Object = "trace"
	ObjectGateway Object = "gateway"
	ObjectEgress  Object = "egress"
)

// Filter selects runs; empty fields match every run.
type Filter struct {
	Tenant string
	Task   string
	Status model.RunStatus
	// Limit > 0 caps the number of runs returned.
	Limit int
}

// Run is one run as the interface shows it: its index record, plus what a
// control plane may know beyond it.
type Run struct {
	runindex.Record
	// Worker is the host that holds or held the run's lease, if known.
	Worker string
	// Phases are the run's phase timings, in order, when recorded.
	Phases []Phase
}

// Phase is the time one phase of a run took.
type Phase struct {
	Name string
	// Start is when the phase began, from the first recorded phase's start.
	Start    time.Duration
	Duration time.Duration
}

// phasesOf are the phases of a run's recorded timing spans (the index
// record's Timings), in the order they began.
func phasesOf(spans []timings.Span) []Phase {
	if len(spans) == 0 {
		return nil
	}
	out := make([]Phase, len(spans))
	for i, s := range spans {
		out[i] = Phase{Name: s.Phase, Start: millis(s.StartMS), Duration: millis(s.DurationMS)}
	}
	slices.SortStableFunc(out, func(a, b Phase) int { return cmp.Compare(a.Start, b.Start) })
	return out
}

// millis is ms milliseconds as a Duration.
func millis(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// runOf is the interface's view of an index record.
func runOf(rec runindex.Record) Run { return Run{Record: rec, Phases: phasesOf(rec.Timings)} }

// Artifact is one file the run delivered.
type Artifact struct {
	// Path is relative to the run's artifacts directory, as the agent named it.
	Path        string
	Size        int64
	SHA256      string
	ContentType string
}

// Chunk is a piece of a run's output stream.
type Chunk struct {
	// Offset is the stream offset of Data's first byte.
	Offset int64
	Data   []byte
	// Ended is true when the stream ended with Data: nothing follows.
	Ended bool
}

// Host is one worker host as the control plane knows it.
type Host struct {
	ID string
	// Reported is true when the worker's capacity and heartbeat are known
	// (Slots, FreeSlots, WarmPool, LastHeartbeat); otherwise the host is
	// known only by the leases it holds.
	Reported bool
	// Slots and FreeSlots are the worker's capacity at its last report.
	Slots, FreeSlots int
	// FreeMemoryBytes and FreeDiskBytes are what it could still grant runs
	// at its last report; 0 when it did not say.
	FreeMemoryBytes, FreeDiskBytes int64
	// Leases are the runs it holds leases on.
	Leases []Lease
	// WarmPool is the number of warm containers it reported, -1 if unknown.
	WarmPool int
	// LastHeartbeat is when it last asked for work or renewed a lease.
	LastHeartbeat time.Time
	// LeaseExpires is when the latest of its leases expires unless renewed.
	LeaseExpires time.Time
	// Labels are what it advertised (runtimes, images, backend).
	Labels map[string]string
}

// Lease is a run a worker holds a lease on.
type Lease struct {
	RunID, Tenant string
}

// Source is what the interface reads. Implementations must be safe for
// concurrent use; every method is read-only.
type Source interface {
	// Runs lists runs matching f, newest first.
	Runs(ctx context.Context, f Filter) ([]Run, error)
	// Run returns one run; ErrNotFound when there is none.
	Run(ctx context.Context, id string) (Run, error)
	// FollowOutput returns the run's output from offset on, at most about
	// max bytes. It waits until there are bytes past offset or the stream
	// ended (Chunk.Ended), or ctx ends.
	FollowOutput(ctx context.Context, id string, offset int64, max int) (Chunk, error)
	// OpenObject opens one of the run's records; ErrNoObject when it has none.
	OpenObject(ctx context.Context, id string, o Object) (io.ReadCloser, error)
	// Artifacts lists the run's artifacts in path order.
	Artifacts(ctx context.Context, id string) ([]Artifact, error)
	// OpenArtifact opens one artifact by its path.
	OpenArtifact(ctx context.Context, id, path string) (io.ReadCloser, error)
	// Hosts lists the worker hosts; ErrNoHosts when the source keeps none.
	Hosts(ctx context.Context) ([]Host, error)
}
