package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"time"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/controlplane/sqlite"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/worker"
	"github.com/taskrun/taskrun/workerclient"
)

// workerSlots is how many runs at once both sides of the worker comparison
// execute.
const workerSlots = 4

// workerThroughput compares runs per minute through the control plane and
// `taskrun worker`'s package (submitted to controlplane/server on SQLite,
// leased over HTTP, fenced PATCHes and stream, lease renewals) with the same
// runs through RunTask called directly, workerSlots at a time on both sides.
func workerThroughput(ctx context.Context, e *env) ([]row, error) {
	n := e.c.workerRuns
	root, err := e.tempDir("direct-")
	if err != nil {
		return nil, err
	}
	host, err := e.host(ctx, root)
	if err != nil {
		return nil, err
	}
	defer host.Close(context.WithoutCancel(ctx))
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
			errs[i] = concurrentRun(ctx, e, host, fmt.Sprintf("direct-%d", i))
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
		what:     fmt.Sprintf("%d runs (`echo $TASKRUN_RUN_ID`), %d at a time: submitted to serve (SQLite) and run by a worker vs RunTask directly", n, workerSlots),
		taskrun:  fmt.Sprintf("%.0f runs/min (%s)", perMin(through), fmtDuration(through)),
		baseline: fmt.Sprintf("%.0f runs/min (%s)", perMin(direct), fmtDuration(direct)),
		ratio:    fmt.Sprintf("%.2fx", through.Seconds()/direct.Seconds()),
		target:   "≤ 1.2x",
		verdict:  verdict(through.Seconds() <= 1.2*direct.Seconds()),
	}}, nil
}

// throughWorker runs n runs submitted to the reference control plane
// (controlplane/server on SQLite, the code `taskrun serve` runs) through a
// worker leasing from it over loopback HTTP, and returns the wall time from
// the worker's start until the control plane recorded the last run ended.
func throughWorker(ctx context.Context, e *env, n int) (time.Duration, error) {
	const workerToken, userToken = "bench-worker-token-0123456789", "bench-user-token-0123456789"
	root, err := e.tempDir("worker-")
	if err != nil {
		return 0, err
	}
	db, err := sqlite.Open(ctx, filepath.Join(root, "cp.db"))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var tokens server.Tokens
	if err := errors.Join(tokens.AddWorker(server.DefaultWorker, workerToken), tokens.AddUser("bench", userToken)); err != nil {
		return 0, err
	}
	discard := slog.New(slog.DiscardHandler)
	srv, err := server.New(server.Config{Store: db, Blobs: e.store, Tokens: &tokens, Log: discard})
	if err != nil {
		return 0, err
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	sctx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	go srv.Sweep(sctx)
	users, err := client.New(hs.URL, userToken, nil)
	if err != nil {
		return 0, err
	}
	ids := make([]string, n)
	for i := range n {
		resp, err := users.Submit(ctx, controlplane.SubmitRequest{Prompt: "bench", Command: []string{"sh", "-c", "echo $TASKRUN_RUN_ID"}}, nil)
		if err != nil {
			return 0, fmt.Errorf("submit: %w", err)
		}
		ids[i] = resp.RunID
	}

	host, err := executor.New(ctx, e.hostConfig(root))
	if err != nil {
		return 0, err
	}
	defer host.Close(context.WithoutCancel(ctx))
	w, err := worker.New(worker.Config{
		Client:      workerclient.New(hs.URL, workerToken),
		WorkerID:    "bench",
		Slots:       workerSlots,
		Host:        host,
		Labels:      workerclient.WorkerLabels{Runtimes: []string{"runc"}, Backend: "docker"},
		MemoryBytes: 64 << 30,
		LeaseWait:   time.Second,
		Logger:      discard,
	})
	if err != nil {
		return 0, err
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(wctx) }()
	defer func() {
		stop()
		<-done
	}()
	for {
		runs, err := users.ListRuns(ctx, "", n+10)
		if err != nil {
			return 0, err
		}
		ended := 0
		for _, r := range runs {
			if r.Status.Terminal() {
				ended++
			}
		}
		if ended >= n {
			break
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		time.Sleep(10 * time.Millisecond)
	}
	wall := time.Since(start)
	for _, id := range ids {
		r, err := users.GetRun(ctx, id)
		if err != nil {
			return 0, err
		}
		if r.Status != model.StatusSucceeded || r.Output != id+"\n" {
			return 0, fmt.Errorf("run %s ended %s %q with output %q", id, r.Status, r.Error, r.Output)
		}
	}
	return wall, nil
}
