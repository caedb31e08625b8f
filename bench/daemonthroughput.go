package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/taskrun/taskrun/daemon"
)

// daemonThroughputTarget is the daemon's throughput goal: at least this
// many times the runs per minute of cold in-process runs.
const daemonThroughputTarget = 1.5

// daemonThroughputConcurrency is how many `taskrun run` processes run at
// once in the throughput comparison.
const daemonThroughputConcurrency = 8

// daemonThroughput runs c.daemonRuns `taskrun run -- true` processes, 8 at
// a time, through a `taskrun daemon` (no warm pool), then the same number
// in-process (--local, gc at start, one runs root), and compares runs per
// minute.
func daemonThroughput(ctx context.Context, e *env) ([]row, error) {
	bin, err := e.taskrunBinary()
	if err != nil {
		return nil, err
	}
	dir, err := e.tempDir("daemon-tp-")
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "taskrun.sock")
	cenv := append(os.Environ(), daemon.EnvSocket+"="+sock)
	stop, err := startDaemon(ctx, bin, cenv, sock, dir, "tp", e.c.image)
	if err != nil {
		return nil, err
	}
	defer stop()
	total := e.c.daemonRuns
	runArgs := func(local bool, id string) []string {
		args := []string{"--quiet", "run", "--run-id", id}
		if local {
			args = append(args, "--local", "--root", filepath.Join(dir, "local-runs"), "--store", "file://"+filepath.Join(dir, "local-store"), "--image", e.c.image)
		}
		return append(args, "--", "true")
	}
	batch := func(local bool) (time.Duration, error) {
		return runConcurrently(total, daemonThroughputConcurrency, func(i int) error {
			cmd := exec.CommandContext(ctx, bin, runArgs(local, fmt.Sprintf("%s-tp%v-%d", e.c.benchID, local, i))...)
			cmd.Env = cenv
			cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("taskrun run (local %v) %d: %w", local, i, err)
			}
			return nil
		})
	}
	// One unmeasured run each: helpers unpacked, image inspected.
	for _, local := range []bool{false, true} {
		cmd := exec.CommandContext(ctx, bin, runArgs(local, fmt.Sprintf("%s-tpwarmup%v", e.c.benchID, local))...)
		cmd.Env = cenv
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("taskrun run (local %v): %w: %s", local, err, out)
		}
	}
	viaDaemon, err := batch(false)
	if err != nil {
		return nil, err
	}
	local, err := batch(true)
	if err != nil {
		return nil, err
	}
	perMin := func(d time.Duration) float64 { return float64(total) / d.Minutes() }
	ratio := perMin(viaDaemon) / perMin(local)
	return []row{{
		what:     fmt.Sprintf("runs per minute, %d `taskrun run -- true` processes %d at a time, through `taskrun daemon` (no warm pool)", total, daemonThroughputConcurrency),
		taskrun:  fmt.Sprintf("%.0f runs/min (%s)", perMin(viaDaemon), fmtDuration(viaDaemon)),
		baseline: fmt.Sprintf("taskrun run --local: %.0f runs/min (%s)", perMin(local), fmtDuration(local)),
		ratio:    fmt.Sprintf("%.2f×", ratio),
		target:   fmt.Sprintf("≥ %.1f×", daemonThroughputTarget),
		verdict:  verdict(ratio >= daemonThroughputTarget),
	}}, nil
}
