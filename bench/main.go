// Command bench measures taskrun side by side with the plain tools it
// replaces, in one run on one machine, and prints one Markdown table:
//
//   - start-up of the taskrun binary (`taskrun version`, `taskrun run
//     --help`) against `docker --version` (interleaved, median ratio);
//   - `taskrun run -- true` through a resident `taskrun daemon`, in-process
//     (--local) and `docker run --rm` with the same policy flags, warm hit
//     and pool empty; and runs per minute of 20 such runs 8 at a time,
//     through the daemon against in-process;
//   - a command's round trip in a live run through the daemon's process
//     API against `docker exec` in the same container (median and p95);
//   - a command's round trip in a live run through the control plane's
//     live API (serve proxying to a worker), against docker exec;
//   - cold-run wall time of the Docker backend and of the full RunTask path
//     against `docker run --rm` with the same image, command, policy flags
//     and bind mount (alternated, medians);
//   - latency from the start call to the first stdout byte at the consumer;
//   - stdout throughput of a large output through the backend's spool and
//     through RunTask plus the HTTP stream sender to a local control plane,
//     against a raw pipe of the same bytes, with the executor's peak RSS
//     (the executor runs in a child process, measured with getrusage);
//   - concurrent runs: all must succeed and none may leak a container;
//   - workspace materialization (workspace.CopyTree) against `cp -a`;
//   - runs per minute through the worker (leases from a local control plane)
//     against the same runs through RunTask directly.
//   - the warm pool (package warmpool): claim → first stdout byte, median
//     and p95, beside a cold RunTask's and `docker run`'s first byte, and
//     runs per minute at 8 concurrent runs, warm against cold.
//   - memory checkpoints of gVisor runs (package checkpoint): pause time per
//     GiB, resume time of a sandbox holding 256 MiB, and the time to fork 4
//     from one checkpoint, beside a cold gVisor run's first byte.
//
// Run it with `make bench` or `go run ./bench` (the image
// taskrun/testbox:local must exist: `make images`). Every container it
// creates carries dev.taskrun.managed=true and dev.taskrun.bench=<run id>.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"
)

// labelBench marks the containers of one bench invocation.
const labelBench = "dev.taskrun.bench"

// config is the bench's flags.
type config struct {
	image       string
	runs        int
	startRuns   int
	sizeMiB     int
	concurrency int
	files       int
	copyRounds  int
	workerRuns  int
	warmRuns    int
	daemonRuns  int
	helpersDir  string
	taskrunBin  string
	only        string
	benchID     string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == childCommand {
		os.Exit(childMain(os.Args[2:]))
	}
	var c config
	flag.StringVar(&c.image, "image", "taskrun/testbox:local", "local busybox image to run")
	flag.IntVar(&c.runs, "n", 10, "runs of each variant in the cold-run and first-byte comparisons")
	flag.IntVar(&c.startRuns, "start-n", 100, "runs of each command in the start-up comparison")
	flag.IntVar(&c.sizeMiB, "size", 256, "MiB of stdout in the throughput comparison")
	flag.IntVar(&c.concurrency, "concurrent", 8, "runs started at once in the concurrency check")
	flag.IntVar(&c.files, "files", 5000, "files in the workspace materialization comparison")
	flag.IntVar(&c.copyRounds, "copy-rounds", 3, "rounds of CopyTree and cp -a each")
	flag.StringVar(&c.taskrunBin, "taskrun", "bin/taskrun", "the taskrun binary of the cold CLI comparison (`make build`)")
	flag.IntVar(&c.workerRuns, "worker-runs", 24, "runs in the worker throughput comparison")
	flag.IntVar(&c.warmRuns, "warm-n", 20, "claims (and cold runs, and docker runs) in the warm pool comparison; runs per path in its throughput check")
	flag.IntVar(&c.daemonRuns, "daemon-runs", 20, "taskrun run processes (8 at a time) through the daemon, and in-process, in the daemon throughput comparison")
	flag.StringVar(&c.helpersDir, "helpers-dir", "bin", "directory of the static taskrun-probe and taskrun-relay (make build); the warm pool parks at the self-check")
	flag.StringVar(&c.only, "only", "", "run only the sections whose name contains this, e.g. \"cold\"")
	flag.Parse()
	c.benchID = "bench-" + strings.ToLower(rand.Text()[:10])
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	rows, b, err := runAll(ctx, c)
	printTable(os.Stdout, c, rows)
	printBreakdown(os.Stdout, b)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// section is one group of measurements.
type section struct {
	name string
	run  func(context.Context, *env) ([]row, error)
}

// runAll runs every section, keeping the rows of those that worked, and
// checks at the end that no container was left behind.
func runAll(ctx context.Context, c config) ([]row, *breakdown, error) {
	e, err := newEnv(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	defer e.close()
	var rows []row
	var errs []string
	for _, s := range []section{
		{"CLI start", cliStart},
		{"cold CLI run", coldCLI},
		{"daemon CLI run", daemonCLI},
		{"daemon throughput", daemonThroughput},
		{"live command", liveCommand},
		{"control plane live command", liveCommandControlPlane},
		{"cold run", coldRun},
		{"kubernetes cold run", kubernetesColdRun},
		{"first byte", firstByteLatency},
		{"throughput", throughput},
		{"concurrency", concurrent},
		{"materialization", materialize},
		{"worker", workerThroughput},
		{"warm pool first byte", warmFirstByte},
		{"warm pool throughput", warmThroughput},
		{"checkpoint", checkpointBench},
	} {
		if !strings.Contains(s.name, c.only) {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: %s...\n", s.name)
		start := time.Now()
		rs, err := s.run(ctx, e)
		rows = append(rows, rs...)
		if err != nil {
			errs = append(errs, s.name+": "+err.Error())
		}
		fmt.Fprintf(os.Stderr, "bench: %s done in %s\n", s.name, time.Since(start).Round(time.Second))
	}
	if left, err := e.leftovers(ctx); err != nil || left > 0 {
		errs = append(errs, fmt.Sprintf("containers left behind: %d (%v)", left, err))
	}
	if len(errs) > 0 {
		return rows, e.breakdown, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return rows, e.breakdown, nil
}
