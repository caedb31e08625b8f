package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/taskrun/taskrun/sandbox"
)

// Stats reads the container's cgroup counters once through the engine's
// one-shot stats (API 1.41): CPU total usage, memory usage and its
// high-water mark, blkio bytes read and written, and the pids count. A
// container that exited has no cgroup left: the engine then answers with
// an empty sample, and Stats wraps sandbox.ErrNotRunning.
func (h *handle) Stats(ctx context.Context) (sandbox.Stats, error) {
	select {
	case <-h.exited:
		return sandbox.Stats{}, fmt.Errorf("stats of container %s: %w", shortID(h.id), sandbox.ErrNotRunning)
	default:
	}
	resp, err := h.b.api.ContainerStatsOneShot(ctx, h.id)
	if isNotFound(err) {
		return sandbox.Stats{}, fmt.Errorf("stats of container %s: %w: %w", shortID(h.id), sandbox.ErrNotRunning, err)
	}
	if err != nil {
		return sandbox.Stats{}, fmt.Errorf("stats of container %s: %w", shortID(h.id), err)
	}
	defer resp.Body.Close()
	var s container.StatsResponse
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return sandbox.Stats{}, fmt.Errorf("decode stats of container %s: %w", shortID(h.id), err)
	}
	if s.Read.IsZero() {
		return sandbox.Stats{}, fmt.Errorf("stats of container %s: %w", shortID(h.id), sandbox.ErrNotRunning)
	}
	return statsOf(s), nil
}

// statsOf converts the engine's stats of a live container.
func statsOf(s container.StatsResponse) sandbox.Stats {
	out := sandbox.Stats{
		CPU:             time.Duration(s.CPUStats.CPUUsage.TotalUsage),
		MemoryBytes:     int64(s.MemoryStats.Usage),
		PeakMemoryBytes: int64(s.MemoryStats.MaxUsage), // cgroup v1 only
		Pids:            int64(s.PidsStats.Current),
	}
	for _, e := range s.BlkioStats.IoServiceBytesRecursive {
		// cgroup v1 names the operations "Read" and "Write", v2 "read"
		// and "write".
		switch {
		case strings.EqualFold(e.Op, "read"):
			out.ReadBytes += int64(e.Value)
		case strings.EqualFold(e.Op, "write"):
			out.WriteBytes += int64(e.Value)
		}
	}
	return out
}

var _ sandbox.StatsReader = (*handle)(nil)
