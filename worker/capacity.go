package worker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
)

// Reasons the worker does not ask for a run (the values of the
// taskrun_worker_lease_skipped_total metric's reason label).
const (
	skipSlots  = "slots"
	skipMemory = "memory"
	skipDisk   = "disk"
	skipImages = "images"
)

// capacity is what the worker can place now, or the reason it can place
// nothing (then it does not lease).
func (w *Worker) capacity(ctx context.Context) (workerclient.Capacity, string) {
	w.mu.Lock()
	busy, memUsed, diskUsed := len(w.live), w.memUsed, w.diskUsed
	w.mu.Unlock()
	c := workerclient.Capacity{Slots: w.cfg.Slots, FreeSlots: w.cfg.Slots - busy}
	if c.FreeSlots <= 0 {
		return c, skipSlots
	}
	// Parked warm containers hold their memory limit; a ready one is the
	// next run's, so it does not keep the worker from leasing that run.
	reserved, ready := w.warmReserved()
	c.FreeMemoryBytes = max(w.cfg.MemoryBytes-memUsed-reserved, 0)
	if c.FreeMemoryBytes < w.runMemory(0) && ready == 0 {
		return c, skipMemory
	}
	free, err := w.cfg.FreeDisk(w.cfg.Host.Layout().Root())
	if err != nil {
		w.log.Warn("measure free disk", "root", w.cfg.Host.Layout().Root(), "err", err)
		return c, skipDisk
	}
	// The runs held may still grow to their caps.
	c.FreeDiskBytes = free - diskUsed
	if c.FreeDiskBytes < w.runDisk(0, 0) {
		return c, skipDisk
	}
	if len(w.presentImages(ctx)) == 0 && !w.cfg.Labels.CanPull {
		return c, skipImages
	}
	return c, ""
}

// runMemory is a run's memory limit: limit, or the host's default.
func (w *Worker) runMemory(limit int64) int64 {
	if limit > 0 {
		return limit
	}
	return w.cfg.Host.Defaults().Policy.MemoryBytes
}

// runDisk is the disk a run may take: its disk cap and output spools.
func (w *Worker) runDisk(diskLimit, maxOutput int64) int64 {
	if diskLimit == 0 {
		diskLimit = w.cfg.Host.Defaults().DiskLimitBytes
	}
	if diskLimit == 0 {
		diskLimit = executor.DefaultDiskLimitBytes
	}
	if maxOutput == 0 {
		maxOutput = w.cfg.Host.Defaults().MaxOutputBytes
	}
	if maxOutput == 0 {
		maxOutput = executor.DefaultMaxOutputBytes
	}
	return executor.DiskNeed(diskLimit, maxOutput)
}

// labels are the worker's labels with the images present now.
func (w *Worker) labels(ctx context.Context) workerclient.WorkerLabels {
	l := w.cfg.Labels
	l.Images = w.presentImages(ctx)
	return l
}

// presentImages are the offered images the engine has locally.
func (w *Worker) presentImages(ctx context.Context) []string {
	ic, ok := w.cfg.Host.Backend().(sandbox.ImageChecker)
	if !ok {
		return w.cfg.Images
	}
	var out []string
	for _, img := range w.cfg.Images {
		err := ic.CheckImage(ctx, img)
		switch {
		case err == nil:
			out = append(out, img)
		case !errors.Is(err, sandbox.ErrImageNotFound) && ctx.Err() == nil:
			w.log.Warn("check image", "image", img, "err", err)
		}
	}
	return out
}

// statfsFree is the free space of dir's file system for unprivileged use.
func statfsFree(dir string) (int64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	return diskcap.Free(dir)
}

// hostMemory is the host's MemTotal from /proc/meminfo.
func hostMemory() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse MemTotal %q: %w", rest, err)
		}
		return kb << 10, nil
	}
	return 0, errors.New("no MemTotal in /proc/meminfo")
}
