package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/worker"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// workerSlots is how many runs at once both sides of the worker comparison
// execute.
const workerSlots = 4

// workerThroughput compares runs per minute through `taskrun worker`'s
// package (leasing each run over HTTP from a local control plane, fenced
// PATCHes and stream, lease renewals) with the same runs through RunTask
// called directly, workerSlots at a time on both sides.
func workerThroughput(ctx context.Context, e *env) ([]row, error) {
	n := e.c.workerRuns
	root, err := e.tempDir("direct-")
	if err != nil {
		return nil, err
	}
	sem := make(chan struct{}, workerSlots)
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = concurrentRun(ctx, e, root, fmt.Sprintf("direct-%d", i))
		}()
	}
	wg.Wait()
	direct := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("direct runs: %w", err)
		}
	}

	through, err := throughWorker(ctx, e, n)
	if err != nil {
		return nil, err
	}
	perMin := func(d time.Duration) float64 { return float64(n) / d.Minutes() }
	return []row{{
		what:     fmt.Sprintf("%d runs (`echo $TASKRUN_RUN_ID`), %d at a time: through the worker (lease, fenced HTTP reports, renewals) vs RunTask directly", n, workerSlots),
		taskrun:  fmt.Sprintf("%.0f runs/min (%s)", perMin(through), fmtDuration(through)),
		baseline: fmt.Sprintf("%.0f runs/min (%s)", perMin(direct), fmtDuration(direct)),
		ratio:    fmt.Sprintf("%.2fx", through.Seconds()/direct.Seconds()),
		target:   "≤ 1.2x",
		verdict:  verdict(through.Seconds() <= 1.2*direct.Seconds()),
	}}, nil
}

// throughWorker runs n runs through a worker leasing from a local control
// plane and returns the wall time until the last one reported.
func throughWorker(ctx context.Context, e *env, n int) (time.Duration, error) {
	tb := &benchTB{}
	defer tb.close()
	cp := controlplanetest.New(tb, "bench-token")
	root, err := e.tempDir("worker-")
	if err != nil {
		return 0, err
	}
	tmpl := e.input(root, "unused", nil)
	tmpl.Task, tmpl.Run, tmpl.Updater = nil, nil, nil
	w, err := worker.New(worker.Config{
		Client:      workerclient.New(cp.URL(), "bench-token"),
		WorkerID:    "bench",
		Slots:       workerSlots,
		Root:        root,
		Template:    tmpl,
		Labels:      workerclient.WorkerLabels{Runtimes: []string{"runc"}, Backend: "docker"},
		MemoryBytes: 64 << 30,
		LeaseWait:   time.Second,
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return 0, err
	}
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("worker-%d", i)
		cp.Enqueue(workerclient.Assignment{
			Task:      model.Task{ID: "bench", UserID: "bench", ConversationID: "bench"},
			Run:       model.TaskRun{ID: ids[i], TaskID: "bench"},
			SessionID: "bench",
			Command:   []string{"sh", "-c", "echo $TASKRUN_RUN_ID"},
		})
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(wctx) }()
	var wall time.Duration
	for {
		ended := 0
		for _, id := range ids {
			if cp.Lease(id).Status.Terminal() {
				ended++
			}
		}
		if ended == n {
			wall = time.Since(start)
			break
		}
		if ctx.Err() != nil {
			stop()
			<-done
			return 0, ctx.Err()
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		return 0, err
	}
	for _, id := range ids {
		if info := cp.Lease(id); info.Status != model.StatusSucceeded {
			return 0, fmt.Errorf("run %s ended %s %q", id, info.Status, info.Reason)
		}
		if data, _, _ := cp.Stream(id); string(data) != id+"\n" {
			return 0, fmt.Errorf("run %s streamed %q", id, data)
		}
	}
	if errs := tb.errors(); len(errs) > 0 {
		return 0, fmt.Errorf("control plane: %v", errs)
	}
	return wall, nil
}

// benchTB lets the bench use the test control plane outside a test: it
// collects errors and cleanups. Only the methods controlplanetest calls are
// implemented; the embedded nil testing.TB is never called.
type benchTB struct {
	testing.TB
	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (b *benchTB) Helper() {}

func (b *benchTB) Errorf(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.errs = append(b.errs, fmt.Sprintf(format, args...))
}

func (b *benchTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (b *benchTB) Cleanup(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cleanups = append(b.cleanups, f)
}

func (b *benchTB) errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.errs
}

// close runs the cleanups, last first.
func (b *benchTB) close() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
}
