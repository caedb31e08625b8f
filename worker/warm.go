package worker

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/warmpool"
	"github.com/taskrun/taskrun/workerclient"
)

// warmCloseTimeout bounds removing the parked containers at shutdown.
const warmCloseTimeout = 2 * time.Minute

// warmID names the placeholder run the worker's warm key is computed for:
// a key holds nothing of a run's identity.
const warmID = "warm"

// warmTemplate is the pool key of a run that takes every default of the
// worker's host (its image, runtime and policy): the key the host's warm
// pool keeps ready.
func (w *Worker) warmTemplate(ctx context.Context) (warmpool.Template, error) {
	return w.cfg.Host.WarmTemplate(ctx, executor.Spec{
		Task:      &model.Task{ID: warmID, UserID: warmID, ConversationID: warmID},
		Run:       &model.TaskRun{ID: warmID, TaskID: warmID},
		SessionID: warmID,
		Updater:   nopUpdater{},
	})
}

// keepWarm asks the pool to keep tmpl's slots ready (it forgets a key no
// run claimed for its MaxIdle otherwise).
func (w *Worker) keepWarm(tmpl *warmpool.Template) {
	pool := w.cfg.Host.WarmPool()
	if pool == nil || tmpl == nil {
		return
	}
	if err := pool.Warm(*tmpl); err != nil {
		w.log.Warn("keep warm containers", "err", err)
	}
}

// closeWarm removes the pool's parked containers once the runs drained.
func (w *Worker) closeWarm() {
	pool := w.cfg.Host.WarmPool()
	if pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), warmCloseTimeout)
	defer cancel()
	if err := pool.Close(ctx); err != nil {
		w.log.Warn("close the warm pool", "err", err)
	}
}

// warmReserved is the memory the pool's parked and filling containers may
// take: each holds a run's memory limit until a run claims it.
func (w *Worker) warmReserved() (reserved int64, ready int) {
	if w.cfg.Host.WarmPool() == nil {
		return 0, 0
	}
	s := w.cfg.Host.WarmPool().Stats()
	return int64(s.Ready+s.Filling) * w.runMemory(0), s.Ready
}

// registerWarm exports the pool's state as the worker's
// taskrun_worker_warm_* series.
func registerWarm(reg prometheus.Registerer, pool *warmpool.Pool) error {
	stat := func(f func(warmpool.Stats) int) func() float64 {
		return func() float64 { return float64(f(pool.Stats())) }
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "taskrun_worker_warm_ready",
			Help: "Warm containers parked and ready for a run."}, stat(func(s warmpool.Stats) int { return s.Ready })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "taskrun_worker_warm_filling",
			Help: "Warm containers being started."}, stat(func(s warmpool.Stats) int { return s.Filling })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "taskrun_worker_warm_claims_total",
			Help: "Runs that started in a warm container."}, stat(func(s warmpool.Stats) int { return s.Claims })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "taskrun_worker_warm_misses_total",
			Help: "Runs that found no warm container of their key ready and started cold."}, stat(func(s warmpool.Stats) int { return s.Misses })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "taskrun_worker_warm_audit_failures_total",
			Help: "Warm containers destroyed because their self-check or live audit failed."}, stat(func(s warmpool.Stats) int { return s.AuditFailures })),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// nopUpdater stands in for a run's updater where no run is reported.
type nopUpdater struct{}

func (nopUpdater) UpdateRunStatus(context.Context, string, *workerclient.PatchTaskRunRequest) error {
	return nil
}
