package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"time"
)

// startTarget is the start-up target: `taskrun version` no slower than
// `docker --version`.
const startTarget = 1.0

// cliStart compares the taskrun binary's start-up with the docker CLI's:
// `taskrun version` and `taskrun run --help` (flag parsing and usage of
// the largest command, no engine, store or cluster touched) against `docker
// --version`, in interleaved triples so each ratio shares the machine's load
// of its moment. Both binaries do nothing but start, initialise their
// packages and print, so the ratio is the cost of what taskrun links and
// initialises for every command.
func cliStart(ctx context.Context, e *env) ([]row, error) {
	bin, err := e.taskrunBinary()
	if err != nil {
		return nil, err
	}
	timed := func(name string, args ...string) variant {
		return func(ctx context.Context, _ *env, _ int) (time.Duration, error) {
			cmd := exec.CommandContext(ctx, name, args...)
			cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
			start := time.Now()
			if err := cmd.Run(); err != nil {
				return 0, fmt.Errorf("%s %v: %w", name, args, err)
			}
			return time.Since(start), nil
		}
	}
	docker := timed("docker", "--version")
	version := timed(bin, "version")
	runHelp := timed(bin, "run", "--help")
	// Warm the page cache for all three binaries first.
	if _, err := alternate(ctx, e, 3, docker, version, runHelp); err != nil {
		return nil, err
	}
	ds, err := alternate(ctx, e, e.c.startRuns, docker, version, runHelp)
	if err != nil {
		return nil, err
	}
	n := fmt.Sprintf(" (median of %d interleaved runs)", e.c.startRuns)
	base := "docker --version: " + fmtDuration(median(ds[0]))
	vr := medianRatio(ds[1], ds[0])
	return []row{
		{
			what:     "start: `taskrun version`" + n,
			taskrun:  fmtDuration(median(ds[1])),
			baseline: base,
			ratio:    fmt.Sprintf("%.2f×", vr),
			target:   fmt.Sprintf("≤ %.2f×", startTarget),
			verdict:  verdict(vr <= startTarget),
		},
		{
			what:     "start: `taskrun run --help`" + n,
			taskrun:  fmtDuration(median(ds[2])),
			baseline: base,
			ratio:    fmt.Sprintf("%.2f×", medianRatio(ds[2], ds[0])),
		},
	}, nil
}

// medianRatio is the median of got[i]/base[i]: the ratios of runs made
// back to back.
func medianRatio(got, base []time.Duration) float64 {
	ratios := make([]float64, 0, len(got))
	for i := range min(len(got), len(base)) {
		ratios = append(ratios, float64(got[i])/float64(base[i]))
	}
	return medianF(ratios)
}
