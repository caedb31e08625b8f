package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// cliTarget is the cold-run target: `taskrun run -- true`, every protection
// on, against `docker run --rm --network none IMAGE true`.
const cliTarget = 1.05

// breakdown is the per-phase medians of the cold CLI runs and of docker's
// own create/start/wait/remove, printed after the table.
type breakdown struct {
	runs    int
	phases  []phaseMedian
	docker  []phaseMedian
	cli     time.Duration
	baseCLI time.Duration
}

// phaseMedian is one phase's median over the measured runs.
type phaseMedian struct {
	phase         string
	start, length float64 // ms
}

// coldCLI compares the taskrun binary's cold run of `true` (default flags:
// self-check, live audit, disk cap, own uid, gc at start) with `docker run
// --rm --network none`, in interleaved pairs, and times docker's create,
// start, wait and remove through the API beside them. One unmeasured pair
// warms the helpers cache first, as on any host after its first run.
func coldCLI(ctx context.Context, e *env) ([]row, error) {
	bin, err := e.taskrunBinary()
	if err != nil {
		return nil, err
	}
	root, err := e.tempDir("cli-root-")
	if err != nil {
		return nil, err
	}
	store := "file://" + filepath.Join(root, "store")
	var spans [][]timings.Span
	dockerRun := func(ctx context.Context, e *env, _ int) (time.Duration, error) {
		start := time.Now()
		out, err := exec.CommandContext(ctx, "docker", "run", "--rm", "--network", "none",
			"--label", sandbox.LabelManaged+"=true", "--label", labelBench+"="+e.c.benchID, e.c.image, "true").CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("docker run: %w: %s", err, out)
		}
		return time.Since(start), nil
	}
	taskrunRun := func(ctx context.Context, e *env, i int) (time.Duration, error) {
		cmd := exec.CommandContext(ctx, bin, "--quiet", "run", "--root", filepath.Join(root, "runs"), "--store", store,
			"--run-id", fmt.Sprintf("%s-cli-%d", e.c.benchID, i), "--image", e.c.image, "--json", "--", "true")
		cmd.Stderr = io.Discard
		start := time.Now()
		out, err := cmd.Output()
		d := time.Since(start)
		if err != nil {
			return 0, fmt.Errorf("taskrun run: %w: %s", err, out)
		}
		var res struct {
			Status  string         `json:"status"`
			Timings []timings.Span `json:"timings"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			return 0, fmt.Errorf("taskrun run --json: %w", err)
		}
		if res.Status != "SUCCEEDED" {
			return 0, fmt.Errorf("taskrun run ended %s", res.Status)
		}
		if i >= 0 {
			spans = append(spans, res.Timings)
		}
		return d, nil
	}
	var apiPhases [][4]time.Duration
	dockerAPI := func(ctx context.Context, e *env, _ int) (time.Duration, error) {
		ph, err := e.dockerPhases(ctx)
		if err != nil {
			return 0, err
		}
		apiPhases = append(apiPhases, ph)
		return ph[0] + ph[1] + ph[2] + ph[3], nil
	}
	// Warm-up pair, not measured.
	if _, err := dockerRun(ctx, e, 0); err != nil {
		return nil, err
	}
	if _, err := taskrunRun(ctx, e, -1); err != nil {
		return nil, err
	}
	ds, err := alternate(ctx, e, e.c.runs, dockerRun, taskrunRun, dockerAPI)
	if err != nil {
		return nil, err
	}
	// The ratio is the median of the pairs' ratios: each pair ran back to
	// back, so it shares the machine's load of the moment.
	ratio := medianRatio(ds[1], ds[0])
	e.breakdown = &breakdown{runs: len(spans), phases: medianPhases(spans), cli: median(ds[1]), baseCLI: median(ds[0])}
	for j, name := range []string{"create", "start", "wait", "remove"} {
		var col []time.Duration
		for _, ph := range apiPhases {
			col = append(col, ph[j])
		}
		e.breakdown.docker = append(e.breakdown.docker, phaseMedian{phase: name, length: ms(median(col))})
	}
	n := fmt.Sprintf(" (median of %d interleaved pairs)", e.c.runs)
	r := row{
		what:     "cold `taskrun run -- true` (CLI, every protection on)" + n,
		taskrun:  fmtDuration(median(ds[1])),
		baseline: "docker run --rm --network none: " + fmtDuration(median(ds[0])),
		ratio:    fmt.Sprintf("%.2f×", ratio),
		target:   fmt.Sprintf("≤ %.2f×", cliTarget),
		verdict:  verdict(ratio <= cliTarget),
	}
	return []row{r}, nil
}

// dockerPhases creates, starts, waits for and removes a `true` container
// through the Engine API, as docker run does, and times each step.
func (e *env) dockerPhases(ctx context.Context) ([4]time.Duration, error) {
	var out [4]time.Duration
	t := time.Now()
	created, err := e.cli.ContainerCreate(ctx, &container.Config{
		Image: e.c.image, Cmd: []string{"true"},
		Labels: map[string]string{sandbox.LabelManaged: "true", labelBench: e.c.benchID},
	}, &container.HostConfig{NetworkMode: "none"}, nil, nil, "")
	if err != nil {
		return out, err
	}
	out[0] = time.Since(t)
	defer e.cli.ContainerRemove(context.WithoutCancel(ctx), created.ID, container.RemoveOptions{Force: true})
	waitC, errC := e.cli.ContainerWait(ctx, created.ID, container.WaitConditionNextExit)
	t = time.Now()
	if err := e.cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		return out, err
	}
	out[1] = time.Since(t)
	t = time.Now()
	select {
	case <-waitC:
	case err := <-errC:
		return out, err
	}
	out[2] = time.Since(t)
	t = time.Now()
	if err := e.cli.ContainerRemove(ctx, created.ID, container.RemoveOptions{}); err != nil {
		return out, err
	}
	out[3] = time.Since(t)
	return out, nil
}

// taskrunBinary is the taskrun CLI to measure: -taskrun, built by `make
// build`.
func (e *env) taskrunBinary() (string, error) {
	bin, err := filepath.Abs(e.c.taskrunBin)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("the taskrun binary %s: %w; build it with `make build` or pass -taskrun", bin, err)
	}
	return bin, nil
}

// medianPhases is, for each phase the runs recorded (the first span of it
// in each run), the median start and duration, in order of start.
func medianPhases(runs [][]timings.Span) []phaseMedian {
	starts, lengths := map[string][]float64{}, map[string][]float64{}
	var order []string
	for _, spans := range runs {
		seen := map[string]bool{}
		for _, s := range spans {
			if seen[s.Phase] {
				// A phase timed more than once (journal writes) adds up.
				l := lengths[s.Phase]
				l[len(l)-1] += s.DurationMS
				continue
			}
			seen[s.Phase] = true
			if _, ok := starts[s.Phase]; !ok {
				order = append(order, s.Phase)
			}
			starts[s.Phase] = append(starts[s.Phase], s.StartMS)
			lengths[s.Phase] = append(lengths[s.Phase], s.DurationMS)
		}
	}
	out := make([]phaseMedian, 0, len(order))
	for _, p := range order {
		out = append(out, phaseMedian{phase: p, start: medianF(starts[p]), length: medianF(lengths[p])})
	}
	slices.SortStableFunc(out, func(a, b phaseMedian) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	return out
}

func medianF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// printBreakdown writes where the cold CLI run's time goes, beside docker's
// own steps.
func printBreakdown(w io.Writer, b *breakdown) {
	if b == nil {
		return
	}
	fmt.Fprintf(w, "\n### Where a cold `taskrun run -- true` spends its time (medians of %d runs, ms)\n\n", b.runs)
	fmt.Fprintf(w, "Whole command: taskrun %.1f ms, docker run --rm %.1f ms. Phases that overlap ran concurrently; `journal` adds up every journal write of a run.\n\n", ms(b.cli), ms(b.baseCLI))
	fmt.Fprintln(w, "| taskrun phase | starts at | takes | | docker API step | takes |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for i := 0; i < max(len(b.phases), len(b.docker)); i++ {
		cells := []string{"", "", "", "", "", ""}
		if i < len(b.phases) {
			p := b.phases[i]
			cells[0], cells[1], cells[2] = "`"+p.phase+"`", fmt.Sprintf("%.1f", p.start), fmt.Sprintf("%.1f", p.length)
		}
		if i < len(b.docker) {
			d := b.docker[i]
			cells[4], cells[5] = d.phase, fmt.Sprintf("%.1f", d.length)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}
