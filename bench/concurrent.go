package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// streamCheck is a StreamSender that keeps one run's stream to compare.
type streamCheck struct {
	mu   sync.Mutex
	data []byte
}

func (s *streamCheck) Send(_ context.Context, _ string, d workerclient.Delta) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.Offset != int64(len(s.data)) {
		return fmt.Errorf("delta at %d, have %d bytes", d.Offset, len(s.data))
	}
	s.data = append(s.data, d.Data...)
	return nil
}

func (s *streamCheck) End(context.Context, string, int64) error { return nil }

// concurrent starts many RunTasks at once on the shared backend and store:
// every one must succeed with its own output, and none may leave a
// container behind.
func concurrent(ctx context.Context, e *env) ([]row, error) {
	n := e.c.concurrency
	root, err := e.tempDir("concurrent-")
	if err != nil {
		return nil, err
	}
	h, err := e.host(ctx, root)
	if err != nil {
		return nil, err
	}
	defer h.Close(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = concurrentRun(ctx, e, h, fmt.Sprintf("conc-%d", i))
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	ok := 0
	var firstErr error
	for _, err := range errs {
		if err == nil {
			ok++
		} else if firstErr == nil {
			firstErr = err
		}
	}
	left, err := e.leftovers(ctx)
	if err != nil {
		return nil, err
	}
	r := row{
		what:     fmt.Sprintf("%d concurrent RunTasks (`echo $TASKRUN_RUN_ID`), shared backend", n),
		taskrun:  fmt.Sprintf("%d/%d succeeded in %s: %.0f runs/min", ok, n, fmtDuration(wall), float64(n)/wall.Minutes()),
		baseline: fmt.Sprintf("containers left afterwards: %d", left),
		target:   "all succeed, none left",
		verdict:  verdict(ok == n && left == 0),
	}
	if firstErr != nil {
		r.verdict += fmt.Sprintf(" (first error: %v)", firstErr)
	}
	return []row{r}, nil
}

// concurrentRun is one run; its stream must be its own run ID.
func concurrentRun(ctx context.Context, e *env, h *executor.Host, runID string) error {
	upd := &statusUpdater{}
	spec := e.spec(runID, upd, "sh", "-c", "echo $TASKRUN_RUN_ID")
	stream := &streamCheck{}
	spec.StreamSender = stream
	if err := e.runOn(ctx, h, "", spec); err != nil {
		return err
	}
	if upd.last != model.StatusSucceeded {
		return fmt.Errorf("run %s reported %s", runID, upd.last)
	}
	stream.mu.Lock()
	defer stream.mu.Unlock()
	if string(stream.data) != runID+"\n" {
		return fmt.Errorf("run %s streamed %q", runID, stream.data)
	}
	return nil
}
