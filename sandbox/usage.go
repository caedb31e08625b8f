package sandbox

import (
	"context"
	"errors"
	"time"
)

// ErrNotRunning is wrapped by StatsReader.Stats when the container no
// longer runs: its counters are gone with its cgroup, and the caller keeps
// the last sample it read.
var ErrNotRunning = errors.New("container is not running")

// Stats is one sample of a live container's resource counters, as its
// cgroup keeps them. Counters (CPU, I/O) are cumulative since the
// container started; MemoryBytes and Pids are what it holds now.
type Stats struct {
	// CPU is the CPU time the container's processes used, user and
	// system, on every core.
	CPU time.Duration
	// MemoryBytes is the memory charged to the container now;
	// PeakMemoryBytes the most it was ever charged, as the cgroup recorded
	// it (cgroup v1 memory.max_usage_in_bytes), 0 where the cgroup keeps
	// no high-water mark.
	MemoryBytes     int64
	PeakMemoryBytes int64
	// ReadBytes and WriteBytes are the bytes the container's processes
	// read from and wrote to block devices (blkio io_service_bytes).
	ReadBytes  int64
	WriteBytes int64
	// Pids is the number of processes and threads in the container now.
	Pids int64
}

// StatsReader is implemented by a Handle whose backend samples its
// container's resource counters (Capabilities.Stats).
type StatsReader interface {
	// Stats reads the live container's counters once. It wraps
	// ErrNotRunning once the container exited.
	Stats(ctx context.Context) (Stats, error)
}

// Usage is what a run's container used, summed up from the samples of its
// Stats: the figures of its record.
type Usage struct {
	// CPUSeconds is the CPU time used, at the last sample.
	CPUSeconds float64 `json:"cpu_seconds"`
	// PeakMemoryBytes is the most memory the container was charged, as
	// its cgroup counts it: page cache and tmpfs included.
	PeakMemoryBytes int64 `json:"peak_memory_bytes"`
	// ReadBytes and WriteBytes are the block I/O bytes, at the last sample.
	ReadBytes  int64 `json:"read_bytes"`
	WriteBytes int64 `json:"write_bytes"`
	// PeakPids is the most processes and threads seen at one sample.
	PeakPids int64 `json:"peak_pids"`
	// Samples counts the samples the figures come from.
	Samples int `json:"samples"`
}

// Add takes one sample into u: the counters as they are now, the peaks as
// the highest seen.
func (u *Usage) Add(s Stats) {
	u.CPUSeconds = max(u.CPUSeconds, s.CPU.Seconds())
	u.PeakMemoryBytes = max(u.PeakMemoryBytes, s.PeakMemoryBytes, s.MemoryBytes)
	u.ReadBytes = max(u.ReadBytes, s.ReadBytes)
	u.WriteBytes = max(u.WriteBytes, s.WriteBytes)
	u.PeakPids = max(u.PeakPids, s.Pids)
	u.Samples++
}
