package runtest

import (
	"context"
	"log/slog"
	"sync"
)

// StepLog is a slog.Handler that records the "step" of every "run step" log
// record: the order in which a run's side effects happened, as its tracer
// saw them. Give slog.New(&StepLog{}) to a run's Logger.
type StepLog struct {
	mu    sync.Mutex
	steps []string
}

// Enabled implements slog.Handler: every record is looked at.
func (l *StepLog) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs implements slog.Handler; the attributes are not kept.
func (l *StepLog) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler; the group is not kept.
func (l *StepLog) WithGroup(string) slog.Handler { return l }

// Handle implements slog.Handler: it records the step of a "run step"
// record and ignores every other record.
func (l *StepLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "run step" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "step" {
			l.mu.Lock()
			l.steps = append(l.steps, a.Value.String())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

// Take returns the steps so far and forgets them.
func (l *StepLog) Take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.steps
	l.steps = nil
	return out
}
