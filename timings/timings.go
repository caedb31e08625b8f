// Package timings records where a run's time goes: one span per phase
// (prepare, disk cap, materialize, create, start, self-check, live audit,
// first byte, wait, collect, persist, report, ...), measured on the
// monotonic clock from the run's start.
//
// A Recorder is made per run and handed to each phase; the sandbox backend
// receives it through the context (NewContext, FromContext) so that it can
// split its Start into create and start without a change to the backend
// contract. A nil *Recorder records nothing, so code that is also run
// without one needs no checks.
package timings

import (
	"context"
	"io"
	"slices"
	"sync"
	"time"
)

// Phase names, as recorded and shown by `taskrun inspect`.
const (
	// Setup is what the CLI does before the run: the store, the engine's
	// client, the helpers.
	Setup = "setup"
	// GC recovers runs of gone executors and reaps their containers.
	GC = "gc"
	// Plan validates and freezes the input.
	Plan = "plan"
	// Preflight checks that the image exists.
	Preflight = "preflight"
	// WarmClaim is taking a parked container from the run's warm pool
	// (package warmpool), hit or miss.
	WarmClaim = "warm_claim"
	// Admit checks the runs root has room for the run.
	Admit = "admit"
	// Journal writes the run's crash-recovery record.
	Journal = "journal"
	// Prepare is the whole of preparing the run directory.
	Prepare = "prepare"
	// UIDLease takes the run's own host uid.
	UIDLease = "uid_lease"
	// DiskCap puts the run directory under its disk cap.
	DiskCap = "disk_cap"
	// Materialize copies the workspace (or restores the session) into home.
	Materialize = "materialize"
	// Snapshot records the starting tree for the change set.
	Snapshot = "snapshot"
	// Gateway starts the run's model gateway.
	Gateway = "gateway"
	// Egress starts the run's egress proxy.
	Egress = "egress"
	// Launch runs from the start request to the started container:
	// create (unless the container was created during prepare), attach,
	// start.
	Launch = "launch"
	// Create creates the container: during prepare where the backend can
	// create ahead (sandbox.Creator), else within launch.
	Create = "create"
	// Attach attaches to the container's streams before it starts.
	Attach = "attach"
	// Start starts the created container.
	Start = "start"
	// SelfCheck runs from the start request to the in-sandbox self-check's
	// report.
	SelfCheck = "self_check"
	// LiveAudit inspects the live container and checks it from the host.
	LiveAudit = "live_audit"
	// FirstByte runs from the start request to the first stdout byte.
	FirstByte = "first_byte"
	// Wait runs until the container exited and its streams were drained.
	Wait = "wait"
	// Records joins the live audit and writes the isolation record once the
	// container exited.
	Records = "records"
	// Drain delivers the output's tail to its consumers.
	Drain = "drain"
	// Remove removes the container.
	Remove = "remove"
	// Collect is the whole of collecting the run's outputs.
	Collect = "collect"
	// KeepLocal writes the local copy a persist retry needs.
	KeepLocal = "keep_local"
	// Persist uploads the run's objects to the store.
	Persist = "persist"
	// Release unmounts and removes the run's local files.
	Release = "release"
	// Report sends the final status to the control plane.
	Report = "report"
	// Index writes the run's record into the store's run index.
	Index = "index"
	// Checkpoint checkpoints a paused run's live sandbox;
	// CheckpointStore packs and stores the checkpoint with the run.
	Checkpoint      = "checkpoint"
	CheckpointStore = "checkpoint_store"
)

// Span is one timed phase: its start as an offset from the run's start and
// its duration, both in milliseconds (microsecond precision).
type Span struct {
	Phase      string  `json:"phase"`
	StartMS    float64 `json:"start_ms"`
	DurationMS float64 `json:"duration_ms"`
}

// Recorder collects a run's spans. It is safe for concurrent use: phases
// that overlap (the live audit while the container starts) record from
// their own goroutines.
type Recorder struct {
	now    func() time.Time
	origin time.Time

	mu     sync.Mutex
	spans  []Span
	starts map[string]time.Time
}

// New returns a Recorder whose origin is now. now is the clock (time.Now
// when nil); time.Now's readings carry the monotonic clock, so spans are
// immune to wall-clock steps. Tests inject a clock they move.
func New(now func() time.Time) *Recorder {
	if now == nil {
		now = time.Now
	}
	return &Recorder{now: now, origin: now(), starts: map[string]time.Time{}}
}

// Now reads the recorder's clock; time.Now for a nil Recorder.
func (r *Recorder) Now() time.Time {
	if r == nil {
		return time.Now()
	}
	return r.now()
}

// Origin is the instant the offsets count from.
func (r *Recorder) Origin() time.Time {
	if r == nil {
		return time.Time{}
	}
	return r.origin
}

// Start begins phase and returns the function that ends it; calling that
// more than once records the span once.
func (r *Recorder) Start(phase string) (stop func()) {
	if r == nil {
		return func() {}
	}
	begin := r.now()
	var once sync.Once
	return func() { once.Do(func() { r.Add(phase, begin, r.now()) }) }
}

// Time runs fn as phase and returns its error.
func (r *Recorder) Time(phase string, fn func() error) error {
	stop := r.Start(phase)
	defer stop()
	return fn()
}

// Since records phase from begin until now.
func (r *Recorder) Since(phase string, begin time.Time) {
	if r == nil {
		return
	}
	r.Add(phase, begin, r.now())
}

// Add records phase from begin to end.
func (r *Recorder) Add(phase string, begin, end time.Time) {
	if r == nil {
		return
	}
	if end.Before(begin) {
		end = begin
	}
	s := Span{Phase: phase, StartMS: ms(begin.Sub(r.origin)), DurationMS: ms(end.Sub(begin))}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, s)
	if _, ok := r.starts[phase]; !ok {
		r.starts[phase] = begin
	}
}

// Began returns when the first span of phase began, if one was recorded.
func (r *Recorder) Began(phase string) (time.Time, bool) {
	if r == nil {
		return time.Time{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.starts[phase]
	return t, ok
}

// Spans returns the spans recorded so far, in order of their start (ties
// in the order recorded).
func (r *Recorder) Spans() []Span {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	out := slices.Clone(r.spans)
	r.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Span) int {
		switch {
		case a.StartMS < b.StartMS:
			return -1
		case a.StartMS > b.StartMS:
			return 1
		}
		return 0
	})
	return out
}

// Total returns the time from the origin to the end of the last span.
func Total(spans []Span) float64 {
	var end float64
	for _, s := range spans {
		end = max(end, s.StartMS+s.DurationMS)
	}
	return end
}

// Find returns the first span of phase in spans.
func Find(spans []Span, phase string) (Span, bool) {
	for _, s := range spans {
		if s.Phase == phase {
			return s, true
		}
	}
	return Span{}, false
}

// ms is d in milliseconds, rounded to the microsecond.
func ms(d time.Duration) float64 {
	return float64(d.Round(time.Microsecond)) / float64(time.Millisecond)
}

type ctxKey struct{}

// NewContext returns ctx carrying r, for code below a contract that takes
// no Recorder (the sandbox backends).
func NewContext(ctx context.Context, r *Recorder) context.Context {
	return context.WithValue(ctx, ctxKey{}, r)
}

// FromContext returns the Recorder ctx carries, or nil.
func FromContext(ctx context.Context) *Recorder {
	r, _ := ctx.Value(ctxKey{}).(*Recorder)
	return r
}

// FirstWrite returns w wrapped so that its first non-empty write records
// phase from begin until that write arrives (the first stdout byte, the
// self-check's report on stderr).
func (r *Recorder) FirstWrite(w io.Writer, phase string, begin time.Time) io.Writer {
	if r == nil {
		return w
	}
	return &firstWrite{w: w, r: r, phase: phase, begin: begin}
}

type firstWrite struct {
	w     io.Writer
	r     *Recorder
	phase string
	begin time.Time
	once  sync.Once
}

func (f *firstWrite) Write(p []byte) (int, error) {
	if len(p) > 0 {
		f.once.Do(func() { f.r.Since(f.phase, f.begin) })
	}
	return f.w.Write(p)
}
