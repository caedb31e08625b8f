package executor

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/taskrun/taskrun/sandbox"
)

// Sampling of a run's resource usage (metricsHook).
const (
	// usageInterval is how often a live container's counters are read.
	usageInterval = time.Second
	// usageReadTimeout bounds one read of the counters.
	usageReadTimeout = 5 * time.Second
)

// metricsHook samples what the run's container uses, when the backend
// reads a container's counters (sandbox.Capabilities.Stats):
//
//	Poststart  a sampler reads the counters at once, then every interval
//	Exited     the sampler ends; one last read while the container still
//	           exists, else the last sample stands; the usage goes to the
//	           run's execution (and from there to its outcome, index
//	           record and attestation)
//
// CPU time and I/O bytes are the counters at the last sample; peak memory
// is the cgroup's own high-water mark (or the most seen where it keeps
// none); peak pids is the most seen at one sample.
type metricsHook struct {
	p        *plan
	interval time.Duration

	mu    sync.Mutex
	usage sandbox.Usage

	stats  sandbox.StatsReader
	cancel context.CancelFunc
	done   chan struct{}
}

func (h *metricsHook) name() string { return "metrics" }

func (h *metricsHook) poststart(ctx context.Context, req *poststartRequest) {
	r, ok := req.Handle.(sandbox.StatsReader)
	if !ok {
		return
	}
	// The sampler outlives the run's cancellation, as the container does
	// while it stops, up to the run's shutdown grace.
	sctx, cancel := context.WithCancel(req.Hard)
	h.stats, h.cancel, h.done = r, cancel, make(chan struct{})
	go h.sample(sctx)
}

// sample reads the counters until ctx ends or the container is gone.
func (h *metricsHook) sample(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for {
		if gone := h.read(ctx); gone {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// read takes one sample; gone reports that the container is no longer
// running, so no later read can succeed.
func (h *metricsHook) read(ctx context.Context) (gone bool) {
	ctx, cancel := context.WithTimeout(ctx, usageReadTimeout)
	defer cancel()
	s, err := h.stats.Stats(ctx)
	switch {
	case errors.Is(err, sandbox.ErrNotRunning):
		return true
	case err != nil:
		if ctx.Err() == nil {
			h.p.log.Debug("read the container's resource usage", "err", err)
		}
		return false
	}
	h.mu.Lock()
	h.usage.Add(s)
	u := h.usage
	h.mu.Unlock()
	if h.p.in.OnUsage != nil {
		h.p.in.OnUsage(u)
	}
	return false
}

func (h *metricsHook) exited(ctx context.Context, _ *exitedRequest, resp *exitedResponse) error {
	if h.cancel == nil {
		return nil
	}
	h.cancel()
	<-h.done
	h.cancel = nil
	// The figures of the run's last moments, while the container still
	// exists (a backend that keeps it after its exit); else the last
	// sample stands.
	h.read(context.WithoutCancel(ctx))
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.usage.Samples > 0 {
		u := h.usage
		resp.Usage = &u
	}
	return nil
}
