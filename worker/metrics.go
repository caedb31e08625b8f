package worker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskrun/taskrun/sandbox"
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
	// The runs' resource usage, as their backend sampled it: one
	// observation per run, with no run label (a run's own figures are in
	// its record).
	runCPU        prometheus.Histogram
	runMemory     prometheus.Histogram
	runPids       prometheus.Histogram
	runBlockBytes *prometheus.CounterVec
	runCPUTotal   prometheus.Counter
	// perRun are the runs in progress' own figures, labelled by run.
	perRun runGauges
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
		runCPU: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "taskrun_worker_run_cpu_seconds",
			Help: "CPU time a run's container used.", Buckets: []float64{.1, .5, 1, 5, 10, 30, 60, 300, 900, 3600}}),
		runMemory: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "taskrun_worker_run_peak_memory_bytes",
			Help: "Peak memory a run's container was charged.", Buckets: prometheus.ExponentialBuckets(16<<20, 2, 10)}),
		runPids: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "taskrun_worker_run_peak_pids",
			Help: "Most processes and threads a run's container had at once.", Buckets: []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000}}),
		runBlockBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "taskrun_worker_run_block_io_bytes_total",
			Help: "Block device bytes the runs' containers read and wrote, by op (read, write)."}, []string{"op"}),
		runCPUTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_worker_run_cpu_seconds_total", Help: "CPU time the runs' containers used."}),
		perRun:      newRunGauges(),
	}
	total := prometheus.NewGauge(prometheus.GaugeOpts{Name: "taskrun_worker_slots_total", Help: "Runs the worker may hold at once."})
	total.Set(float64(slots))
	for _, c := range []prometheus.Collector{total, m.busy, m.runs, m.leases, m.leaseErrors, m.leaseSkipped, m.renewals,
		m.renewFailures, m.leasesLost, m.coldStart, m.duration, m.tokens, m.streamBytes,
		m.runCPU, m.runMemory, m.runPids, m.runBlockBytes, m.runCPUTotal} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, c := range m.perRun.collectors() {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observeUsage adds one run's resource usage; nil (not sampled) adds
// nothing.
func (m *metrics) observeUsage(u *sandbox.Usage) {
	if u == nil {
		return
	}
	m.runCPU.Observe(u.CPUSeconds)
	m.runCPUTotal.Add(u.CPUSeconds)
	m.runMemory.Observe(float64(u.PeakMemoryBytes))
	m.runPids.Observe(float64(u.PeakPids))
	m.runBlockBytes.WithLabelValues("read").Add(float64(u.ReadBytes))
	m.runBlockBytes.WithLabelValues("write").Add(float64(u.WriteBytes))
}

// runGauges are the per-run series: each run's usage at its last live
// sample, labelled by run, dropped once it ended.
type runGauges struct {
	cpu, memory, pids *prometheus.GaugeVec
	io                *prometheus.GaugeVec
}

func newRunGauges() runGauges {
	g := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, append([]string{"run"}, labels...))
	}
	return runGauges{
		cpu:    g("taskrun_worker_live_run_cpu_seconds", "CPU time a run in progress used, at its last sample."),
		memory: g("taskrun_worker_live_run_peak_memory_bytes", "Peak memory a run in progress was charged, at its last sample."),
		pids:   g("taskrun_worker_live_run_peak_pids", "Most processes and threads a run in progress had at one sample."),
		io:     g("taskrun_worker_live_run_block_io_bytes", "Block device bytes a run in progress read and wrote, by op (read, write).", "op"),
	}
}

func (g runGauges) collectors() []prometheus.Collector {
	return []prometheus.Collector{g.cpu, g.memory, g.pids, g.io}
}

// sampleRun sets a run's series to its usage now.
func (m *metrics) sampleRun(run string, u sandbox.Usage) {
	m.perRun.cpu.WithLabelValues(run).Set(u.CPUSeconds)
	m.perRun.memory.WithLabelValues(run).Set(float64(u.PeakMemoryBytes))
	m.perRun.pids.WithLabelValues(run).Set(float64(u.PeakPids))
	m.perRun.io.WithLabelValues(run, "read").Set(float64(u.ReadBytes))
	m.perRun.io.WithLabelValues(run, "write").Set(float64(u.WriteBytes))
}

// forgetRun drops an ended run's series.
func (m *metrics) forgetRun(run string) {
	for _, c := range []*prometheus.GaugeVec{m.perRun.cpu, m.perRun.memory, m.perRun.pids, m.perRun.io} {
		c.DeletePartialMatch(prometheus.Labels{"run": run})
	}
}
