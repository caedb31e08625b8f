package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/model"
)

// metrics are the server's Prometheus series, on its own registry.
type metrics struct {
	reg            *prometheus.Registry
	queueWait      prometheus.Histogram
	leasesGranted  prometheus.Counter
	leasesReturned prometheus.Counter
	renewals       prometheus.Counter
	expiries       *prometheus.CounterVec
	staleFence     *prometheus.CounterVec
	notHolder      *prometheus.CounterVec
	bytesReceived  prometheus.Counter
	bytesSent      prometheus.Counter
	tokens         *prometheus.CounterVec
	tasksSubmitted prometheus.Counter
	authFailures   prometheus.Counter
}

func newMetrics(store controlplane.Store) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "taskrun_queue_wait_seconds",
			Help:    "Time from a run's submission (or requeue's original submission) to its lease.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}),
		leasesGranted:  prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_leases_granted_total", Help: "Leases handed to workers."}),
		leasesReturned: prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_leases_returned_total", Help: "Leases taken for a long poll whose worker had stopped waiting, put back in the queue."}),
		renewals:       prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_lease_renewals_total", Help: "Leases renewed."}),
		expiries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "taskrun_lease_expiries_total",
			Help: "Leases that lapsed (worker lost), by what became of the run: failed, requeued or cancelled."}, []string{"outcome"}),
		staleFence: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "taskrun_stale_fence_refusals_total",
			Help: "Worker calls refused with 412 for a stale or expired lease, by endpoint."}, []string{"endpoint"}),
		notHolder: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "taskrun_lease_holder_refusals_total",
			Help: "Worker calls refused with 403: a lease token or worker credential that is not the current lease's, by endpoint."}, []string{"endpoint"}),
		bytesReceived:  prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_output_bytes_received_total", Help: "Output stream bytes appended from workers."}),
		bytesSent:      prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_output_bytes_streamed_total", Help: "Output bytes streamed to users' output readers."}),
		tokens:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "taskrun_tokens_metered_total", Help: "Model tokens reported by finished runs, by kind: prompt or completion."}, []string{"kind"}),
		tasksSubmitted: prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_tasks_submitted_total", Help: "Tasks accepted on the user API."}),
		authFailures:   prometheus.NewCounter(prometheus.CounterOpts{Name: "taskrun_auth_failures_total", Help: "Requests refused for a missing or unknown token."}),
	}
	m.reg.MustRegister(m.queueWait, m.leasesGranted, m.leasesReturned, m.renewals, m.expiries, m.staleFence, m.notHolder, m.bytesReceived, m.bytesSent, m.tokens,
		m.tasksSubmitted, m.authFailures, &runsCollector{store: store},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, o := range []string{"failed", "requeued", "cancelled"} {
		m.expiries.WithLabelValues(o)
	}
	for _, e := range []string{"patch", "stream", "renew"} {
		m.staleFence.WithLabelValues(e)
		m.notHolder.WithLabelValues(e)
	}
	for _, k := range []string{"prompt", "completion"} {
		m.tokens.WithLabelValues(k)
	}
	return m
}

// runsCollector reports taskrun_runs{status} from the store at scrape time,
// so every replica reports the shared truth.
type runsCollector struct{ store controlplane.Store }

var runsDesc = prometheus.NewDesc("taskrun_runs", "Runs by status, as the database holds them.", []string{"status"}, nil)

func (c *runsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- runsDesc }

func (c *runsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := c.store.CountByStatus(ctx, "")
	if err != nil {
		ch <- prometheus.NewInvalidMetric(runsDesc, err)
		return
	}
	for _, st := range []model.RunStatus{model.StatusQueued, model.StatusRunning, model.StatusPaused, model.StatusSucceeded, model.StatusFailed, model.StatusCancelled} {
		ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(counts[st]), string(st))
	}
}
