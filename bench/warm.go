package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/warmpool"
)

// warmTargetMedian is the warm pool's first-byte target.
const warmTargetMedian = 30 * time.Millisecond

// warmEnv is two hosts on one backend of their own (labelled with an
// instance ID, as an executor's is) and one runs root, both configured as
// taskrun run's: warm with a pool, cold without.
type warmEnv struct {
	*env
	backend    *docker.Backend
	warm, cold *executor.Host
	pool       *warmpool.Pool
}

func newWarmEnv(ctx context.Context, e *env, perKey int) (*warmEnv, error) {
	if e.c.helpersDir == "" {
		return nil, errors.New("a warm pool parks at the self-check: pass -helpers-dir (make build puts them in bin/)")
	}
	inst := instance.NewID()
	backend, err := docker.New(ctx, docker.WithInstance(inst))
	if err != nil {
		return nil, err
	}
	w := &warmEnv{env: e, backend: backend}
	root, err := e.tempDir("warm-")
	if err != nil {
		w.close()
		return nil, err
	}
	cfg := e.hostConfig(root)
	cfg.Backend, cfg.Executor = backend, instance.Info{ID: inst}
	if w.cold, err = executor.New(ctx, cfg); err != nil {
		w.close()
		return nil, err
	}
	cfg.Warm = &executor.Warm{PerKey: perKey, MaxSlots: perKey, FillConcurrency: 4}
	if w.warm, err = executor.New(ctx, cfg); err != nil {
		w.close()
		return nil, err
	}
	w.pool = w.warm.WarmPool()
	return w, nil
}

func (w *warmEnv) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, h := range []*executor.Host{w.warm, w.cold} {
		if h != nil {
			_ = h.Close(ctx)
		}
	}
	w.backend.Close()
}

// host is the warm host, or the cold one.
func (w *warmEnv) host(warm bool) *executor.Host {
	if warm {
		return w.warm
	}
	return w.cold
}

// waitReady waits for n parked containers of spec's key.
func (w *warmEnv) waitReady(ctx context.Context, spec executor.Spec, n int) error {
	tmpl, err := w.warm.WarmTemplate(ctx, spec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	return w.pool.WaitReady(ctx, tmpl, n)
}

// p95 is the 95th percentile (nearest rank).
func p95(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (95*len(s)+99)/100 - 1
	return s[max(i, 0)]
}

// warmFirstByte compares claim → first stdout byte of warm runs with the
// first byte of cold runs (both through RunTask with the self-check) and
// of `docker run`, over c.warmRuns runs each, alternating.
func warmFirstByte(ctx context.Context, e *env) ([]row, error) {
	w, err := newWarmEnv(ctx, e, 2)
	if err != nil {
		return nil, err
	}
	defer w.close()
	claimsBefore := w.pool.Stats().Claims
	// The warm runs' phases, as the run's timings recorder saw them.
	phases := map[string][]time.Duration{}
	runTaskFirst := func(warm bool) variant {
		return func(ctx context.Context, e *env, i int) (time.Duration, error) {
			name := "cold"
			if warm {
				name = "warm"
			}
			spec := w.spec(fmt.Sprintf("%s-first-%d", name, i), &statusUpdater{}, "echo", "x")
			if warm {
				if err := w.waitReady(ctx, spec, 1); err != nil {
					return 0, err
				}
			}
			f := &firstByte{start: time.Now()}
			spec.Stdout = f
			out, err := w.host(warm).Run(ctx, spec)
			if err == nil && out.Status != model.StatusSucceeded {
				err = errors.New("run " + spec.Run.ID + " ended " + string(out.Status))
			}
			if err != nil {
				return 0, err
			}
			if warm {
				for _, sp := range out.Timings {
					phases[sp.Phase] = append(phases[sp.Phase], time.Duration(sp.DurationMS*float64(time.Millisecond)))
				}
			}
			if f.latency() == 0 {
				return 0, errors.New("the run printed nothing")
			}
			return f.latency(), nil
		}
	}
	n := e.c.warmRuns
	ds, err := alternate(ctx, e, n, runTaskFirst(true), runTaskFirst(false), dockerFirstByte)
	if err != nil {
		return nil, err
	}
	if got := w.pool.Stats().Claims - claimsBefore; got != n {
		return nil, fmt.Errorf("%d of %d warm runs took a warm container", got, n)
	}
	warm, cold, cli := ds[0], ds[1], ds[2]
	stats := func(ds []time.Duration) string {
		return fmt.Sprintf("median %s, p95 %s", fmtDuration(median(ds)), fmtDuration(p95(ds)))
	}
	var breakdown []string
	for _, ph := range []string{timings.Plan, timings.Preflight, timings.WarmClaim, timings.Admit, timings.Journal, timings.Prepare, timings.Launch, timings.SelfCheck, timings.FirstByte} {
		if ds := phases[ph]; len(ds) > 0 {
			breakdown = append(breakdown, fmt.Sprintf("%s %s", ph, fmtDuration(median(ds))))
		}
	}
	return []row{
		{
			what:     fmt.Sprintf("warm pool: claim → first stdout byte, full RunTask with self-check (%d claims)", n),
			taskrun:  stats(warm),
			baseline: "docker run --rm: " + stats(cli),
			ratio:    fmt.Sprintf("%.2f×", float64(median(warm))/float64(median(cli))),
			target:   "median ≤ " + fmtDuration(warmTargetMedian),
			verdict:  verdict(median(warm) <= warmTargetMedian),
		},
		{
			what:    "warm pool: the warm runs' phases (package timings, medians; self_check and first_byte count from the gate's release)",
			taskrun: strings.Join(breakdown, ", "),
		},
		{
			what:     fmt.Sprintf("cold: start → first stdout byte, full RunTask with self-check (%d runs)", n),
			taskrun:  stats(cold),
			baseline: "docker run --rm: " + stats(cli),
			ratio:    fmt.Sprintf("%.2f×", float64(median(cold))/float64(median(cli))),
		},
	}, nil
}

// warmThroughput runs c.warmRuns runs per path, 8 at a time, warm (from a
// pool of 8 kept full in the background) and cold, and reports runs per
// minute.
func warmThroughput(ctx context.Context, e *env) ([]row, error) {
	const concurrency = 8
	w, err := newWarmEnv(ctx, e, concurrency)
	if err != nil {
		return nil, err
	}
	defer w.close()
	total := max(e.c.warmRuns, 2*concurrency)
	run := func(warm bool) (time.Duration, error) {
		name := "cold"
		if warm {
			name = "warm"
		}
		return runConcurrently(total, concurrency, func(i int) error {
			spec := w.spec(fmt.Sprintf("%s-tp-%d", name, i), &statusUpdater{}, "sh", "-c", "echo $TASKRUN_RUN_ID")
			return w.runOn(ctx, w.host(warm), "", spec)
		})
	}
	if err := w.waitReady(ctx, w.spec("probe", &statusUpdater{}, "sh", "-c", "echo $TASKRUN_RUN_ID"), concurrency); err != nil {
		return nil, err
	}
	before := w.pool.Stats()
	warmWall, err := run(true)
	if err != nil {
		return nil, fmt.Errorf("warm: %w", err)
	}
	after := w.pool.Stats()
	coldWall, err := run(false)
	if err != nil {
		return nil, fmt.Errorf("cold: %w", err)
	}
	perMin := func(d time.Duration) float64 { return float64(total) / d.Minutes() }
	return []row{{
		what: fmt.Sprintf("runs per minute, %d runs 8 at a time, full RunTask with self-check (warm pool of 8, refilled in the background)", total),
		taskrun: fmt.Sprintf("warm: %.0f runs/min (%d of %d took a parked container)", perMin(warmWall),
			after.Claims-before.Claims, total),
		baseline: fmt.Sprintf("cold: %.0f runs/min", perMin(coldWall)),
		ratio:    fmt.Sprintf("%.2f×", perMin(warmWall)/perMin(coldWall)),
	}}, nil
}
