// Package records bounds what the executor writes on the host on an agent's
// behalf: the spooled stdout and stderr, the trace lines the model gateway
// appends, the gateway's own record of the exchanges and the isolation
// record. The agent drives how much of each there is, so every byte of them
// counts against one Budget per run, sized from the run's disk cap
// (LimitFor). Past the budget nothing grows: a Writer refuses whole writes
// and leaves one marker line saying so, and Take grants less than asked.
package records

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Bounds of a run's budget.
const (
	// DefaultLimit is the budget of a run without a disk cap.
	DefaultLimit int64 = 2 << 30
	// MinLimit is the smallest budget LimitFor returns, so that a tiny disk
	// cap still leaves room for the records of a short run.
	MinLimit int64 = 1 << 20
	// MaxMarkerBytes bounds the marker line a Writer leaves when it first
	// refuses a write; its room is reserved when the Writer is made.
	MaxMarkerBytes = 256
)

// ErrExhausted is returned by a Writer's Write when the run's budget has no
// room for the bytes written; nothing of them was written.
var ErrExhausted = errors.New("records: the run's host record budget is spent")

// LimitFor is the budget of a run whose disk cap is diskCap bytes (0 or
// less: none): the cap itself, at least MinLimit, or DefaultLimit without a
// cap. The host so spends at most twice the disk cap on a run: the run
// directory under its cap, and the records the executor keeps of it.
func LimitFor(diskCap int64) int64 {
	if diskCap <= 0 {
		return DefaultLimit
	}
	return max(diskCap, MinLimit)
}

// Budget is the byte budget shared by a run's host-side records. It is safe
// for concurrent use.
type Budget struct {
	mu      sync.Mutex
	limit   int64
	used    int64
	refused int64
}

// NewBudget returns a budget of limit bytes (limit <= 0: DefaultLimit).
func NewBudget(limit int64) *Budget {
	if limit <= 0 {
		limit = DefaultLimit
	}
	return &Budget{limit: limit}
}

// Limit is the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Used is how many bytes were granted, marker reservations included.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Refused is how many bytes were asked for and not granted.
func (b *Budget) Refused() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused
}

// Take grants up to n bytes and returns how many: n while the budget has
// room, less (down to 0) once it is spent. Callers keep only what was
// granted; a spool drops the rest.
func (b *Budget) Take(n int64) int64 {
	if n <= 0 {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	got := min(n, b.limit-b.used)
	b.used += got
	b.refused += n - got
	return got
}

// takeAll grants n bytes or none.
func (b *Budget) takeAll(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.limit-b.used {
		b.refused += n
		return false
	}
	b.used += n
	return true
}

// Writer is one record written under a Budget. Each Write is kept whole or
// not at all, so a JSON-lines record never ends in half a line. Its methods
// are safe for concurrent use.
type Writer struct {
	mu      sync.Mutex
	budget  *Budget
	w       io.Writer
	marker  []byte
	marked  bool
	refused int64
}

// Writer returns a writer of the record name to w under the budget. The
// room of its marker line is taken from the budget now; when even that is
// not left, the writer refuses every write and leaves no marker.
func (b *Budget) Writer(name string, w io.Writer) *Writer {
	marker := markerLine(name, b.limit)
	if !b.takeAll(int64(len(marker))) {
		marker = nil
	}
	return &Writer{budget: b, w: w, marker: marker}
}

// Write writes p to the record if the budget has room for all of it.
// Otherwise it writes nothing of p, appends the marker line the first time,
// and returns 0 and an error wrapping ErrExhausted.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.budget.takeAll(int64(len(p))) {
		return w.w.Write(p)
	}
	w.refused += int64(len(p))
	if !w.marked && w.marker != nil {
		w.marked = true
		if _, err := w.w.Write(w.marker); err != nil {
			return 0, fmt.Errorf("%w; writing the marker: %w", ErrExhausted, err)
		}
	}
	return 0, fmt.Errorf("%w (%d bytes)", ErrExhausted, w.budget.limit)
}

// Refused is how many bytes this writer was asked to write and did not.
func (w *Writer) Refused() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refused
}

// Marker is the JSON object a Writer appends, as one line, when it first
// refuses a write.
type Marker struct {
	// Truncated is always true: the record ends here.
	Truncated bool `json:"taskrun_record_truncated"`
	// Record names the record.
	Record string `json:"record"`
	// BudgetBytes is the run's budget.
	BudgetBytes int64 `json:"budget_bytes"`
	// Reason says why the record ends.
	Reason string `json:"reason"`
}

// markerLine is the JSON line of the marker, at most MaxMarkerBytes long.
func markerLine(name string, limit int64) []byte {
	if len(name) > 64 {
		name = name[:64]
	}
	line, err := json.Marshal(Marker{
		Truncated:   true,
		Record:      name,
		BudgetBytes: limit,
		Reason:      "the run's host record budget is spent; later writes were dropped",
	})
	if err != nil || len(line)+1 > MaxMarkerBytes {
		return []byte("{\"taskrun_record_truncated\":true}\n")
	}
	return append(line, '\n')
}
