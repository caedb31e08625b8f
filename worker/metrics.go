package worker

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the worker's Prometheus series (names in docs and README).
type metrics struct {
	busy          prometheus.Gauge
	runs          *prometheus.CounterVec
	leases        prometheus.Counter
	leaseErrors   prometheus.Counter
	leaseSkipped  *prometheus.CounterVec
	renewals      prometheus.Counter
	renewFailures prometheus.Counter
	leasesLost    prometheus.Counter
	coldStart     prometheus.Histogram
	duration      prometheus.Histogram
	tokens        *prometheus.CounterVec
	streamBytes   prometheus.Counter
}

// newMetrics registers the worker's series on reg.
func newMetrics(reg prometheus.Registerer, slots int) (*metrics, error) {
	buckets := []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 1800}
	m := &metrics{
		busy: prometheus.NewGauge(prometheus.GaugeOpts{Name: "taskrun_worker_slots_busy", Help: "Runs the worker holds now."}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "taskrun_worker_runs_total",
			Help: "Runs ended, by final status (LOST: stopped after its lease was lost, reported by nobody here)."}, []string{"status"}),
		leases:      prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_worker_lease_acquisitions_total", Help: "Leases acquired."}),
		leaseErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_worker_lease_errors_total", Help: "Lease requests that failed."}),
		leaseSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "taskrun_worker_lease_skipped_total",
			Help: "Times the worker did not ask for work because it could not place a run, by reason (slots, memory, disk, images)."}, []string{"reason"}),
		renewals:      prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_worker_lease_renewals_total", Help: "Lease renewals accepted."}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_worker_lease_renew_failures_total", Help: "Lease renewals that failed or were refused."}),
		leasesLost:    prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_worker_leases_lost_total", Help: "Leases lost (refused or expired): the run was stopped."}),
		coldStart: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "taskrun_worker_cold_start_seconds",
			Help: "From the lease request to the run reported RUNNING.", Buckets: buckets}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "taskrun_worker_run_duration_seconds",
			Help: "From the lease request to the run's final report.", Buckets: buckets}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "taskrun_worker_tokens_total",
			Help: "Model tokens metered by the runs' gateways, by kind (prompt, completion)."}, []string{"kind"}),
		streamBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_worker_stream_bytes_total", Help: "Run output bytes acknowledged by the control plane."}),
	}
	total := prometheus.NewGauge(prometheus.GaugeOpts{Name: "taskrun_worker_slots_total", Help: "Runs the worker may hold at once."})
	total.Set(float64(slots))
	for _, c := range []prometheus.Collector{total, m.busy, m.runs, m.leases, m.leaseErrors, m.leaseSkipped, m.renewals,
		m.renewFailures, m.leasesLost, m.coldStart, m.duration, m.tokens, m.streamBytes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
