package recovery

import (
	"context"
	"errors"
	"time"

	"github.com/taskrun/taskrun/internal/backoff"
	"github.com/taskrun/taskrun/journal"
)

// Kept returns the journal's kept runs that no live process holds: those a
// persist retry (`taskrun persist --all`) may take.
func Kept(d *journal.Dir) ([]*journal.Record, error) {
	recs, err := d.List()
	var kept []*journal.Record
	for _, rec := range recs {
		if rec.Phase != journal.PhaseKept {
			continue
		}
		if held, herr := d.Held(rec.RunID); herr != nil || held {
			err = errors.Join(err, herr)
			continue
		}
		kept = append(kept, rec)
	}
	return kept, err
}

// Backoff spaces the attempts of RetryLoop.
type Backoff struct {
	// Initial is the wait after the first failed attempt.
	Initial time.Duration
	// Max caps the wait, which doubles after each failed attempt.
	Max time.Duration
	// Idle is the wait while nothing is kept.
	Idle time.Duration
}

// DefaultBackoff retries after 30 s, doubling to 15 min, and looks for newly
// kept runs every 5 min.
var DefaultBackoff = Backoff{Initial: 30 * time.Second, Max: 15 * time.Minute, Idle: 5 * time.Minute}

// RetryLoop is a long-lived executor's background retry of kept runs: it
// calls retry, which retries every kept run once and returns how many are
// still kept, until ctx ends. While runs stay kept the wait between calls
// doubles from Initial to Max; once none is kept it is Idle. after, when
// non-nil, replaces time.After (tests).
func RetryLoop(ctx context.Context, b Backoff, retry func(context.Context) (stillKept int), after func(time.Duration) <-chan time.Time) {
	if after == nil {
		after = time.After
	}
	exp := backoff.Exponential{Initial: b.Initial, Max: b.Max}
	failures := 0
	for ctx.Err() == nil {
		next := b.Idle
		if retry(ctx) > 0 {
			failures++
			next = exp.Delay(failures)
		} else {
			failures = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-after(next):
		}
	}
}
