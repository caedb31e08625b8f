package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/spool"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/workerclient"
)

// childCommand re-executes the bench as the executor side of a throughput
// measurement, so that its peak RSS is its own.
const childCommand = "__executor"

// Targets of the throughput comparison.
const (
	minPipeShare = 0.80
	maxRSSMiB    = 64
	readBuffer   = 256 << 10
	bearer       = "bench-token"
)

// transfer is a measured byte stream: how much arrived, from the first to
// the last byte.
type transfer struct {
	Bytes int64         `json:"bytes"`
	Span  time.Duration `json:"span"`
}

// mibps is the transfer's rate in MiB/s.
func (t transfer) mibps() float64 {
	if t.Span <= 0 {
		return 0
	}
	return float64(t.Bytes) / (1 << 20) / t.Span.Seconds()
}

// meter counts bytes and notes the first and last arrival.
type meter struct {
	bytes       int64
	first, last time.Time
}

func (m *meter) add(n int) {
	now := time.Now()
	if m.bytes == 0 && n > 0 {
		m.first = now
	}
	m.bytes += int64(n)
	m.last = now
}

func (m *meter) transfer() transfer { return transfer{Bytes: m.bytes, Span: m.last.Sub(m.first)} }

// consume reads r to the end through a fixed buffer, metering it.
func consume(r io.Reader) (transfer, error) {
	var m meter
	buf := make([]byte, readBuffer)
	for {
		n, err := r.Read(buf)
		m.add(n)
		if errors.Is(err, io.EOF) {
			return m.transfer(), nil
		}
		if err != nil {
			return m.transfer(), err
		}
	}
}

// throughput streams the same number of zero bytes through a raw pipe, the
// backend's spool and RunTask's HTTP stream sender, and measures the
// executor's peak RSS for the latter two.
func throughput(ctx context.Context, e *env) ([]row, error) {
	size := int64(e.c.sizeMiB) << 20
	pipe, err := rawPipe(ctx, e.c.sizeMiB)
	if err != nil {
		return nil, fmt.Errorf("raw pipe: %w", err)
	}
	if pipe.Bytes != size {
		return nil, fmt.Errorf("raw pipe carried %d bytes, want %d", pipe.Bytes, size)
	}
	cli, err := e.dockerRunPipe(ctx)
	if err != nil {
		return nil, fmt.Errorf("docker run: %w", err)
	}
	rows := []row{{
		what:     fmt.Sprintf("stdout throughput, %d MiB, `docker run --rm` (engine attach → CLI → pipe), for reference", e.c.sizeMiB),
		taskrun:  "–",
		baseline: fmt.Sprintf("%.0f MiB/s", cli.mibps()),
		ratio:    fmt.Sprintf("%.0f%% of the raw pipe", cli.mibps()/pipe.mibps()*100),
	}}
	backend, backendRSS, err := e.child(ctx, "backend", "")
	if err != nil {
		return rows, fmt.Errorf("backend: %w", err)
	}
	rows = append(rows, e.throughputRows("sandbox/docker backend → spool → consumer", backend, "", backendRSS, pipe, cli)...)

	cp := newCountingControlPlane()
	defer cp.close()
	_, runRSS, err := e.child(ctx, "runtask", cp.url())
	if err != nil {
		return rows, fmt.Errorf("RunTask: %w", err)
	}
	got, problem := cp.result()
	rows = append(rows, e.throughputRows("RunTask + HTTP StreamSender → local control plane", got, problem, runRSS, pipe, cli)...)
	return rows, nil
}

// throughputRows reports one path's rate against the pipe and its RSS.
// A non-empty problem says why the transfer does not count.
func (e *env) throughputRows(path string, got transfer, problem string, rssMiB float64, pipe, cli transfer) []row {
	size := int64(e.c.sizeMiB) << 20
	share := got.mibps() / pipe.mibps()
	rate := row{
		what:     fmt.Sprintf("stdout throughput, %d MiB, %s (first to last byte)", e.c.sizeMiB, path),
		taskrun:  fmt.Sprintf("%.0f MiB/s", got.mibps()),
		baseline: fmt.Sprintf("raw pipe (dd → os.Pipe → reader): %.0f MiB/s", pipe.mibps()),
		ratio:    fmt.Sprintf("%.0f%% (%.0f%% of docker run)", share*100, got.mibps()/cli.mibps()*100),
		target:   fmt.Sprintf("≥ %.0f%%", minPipeShare*100),
		verdict:  verdict(share >= minPipeShare && got.Bytes == size),
	}
	if got.Bytes != size {
		problem = fmt.Sprintf("%d of %d bytes arrived", got.Bytes, size)
	}
	if problem != "" {
		rate.verdict = "MISSED: " + problem
	}
	rss := row{
		what:     "executor peak RSS during it (" + path + ")",
		taskrun:  fmt.Sprintf("%.1f MiB", rssMiB),
		baseline: "–",
		target:   fmt.Sprintf("≤ %d MiB", maxRSSMiB),
		verdict:  verdict(rssMiB <= maxRSSMiB),
	}
	return []row{rate, rss}
}

// rawPipe runs `dd if=/dev/zero bs=1M count=N` on the host into an os.Pipe
// and reads it as the consumers do.
func rawPipe(ctx context.Context, mib int) (transfer, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return transfer{}, err
	}
	defer pr.Close()
	cmd := exec.CommandContext(ctx, "dd", "if=/dev/zero", "bs=1M", "count="+strconv.Itoa(mib))
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		pw.Close()
		return transfer{}, err
	}
	pw.Close()
	t, err := consume(pr)
	return t, errors.Join(err, cmd.Wait())
}

// dockerRunPipe runs the same dd with `docker run --rm` and reads the CLI's
// stdout through a pipe: the engine's own attach path, for reference.
func (e *env) dockerRunPipe(ctx context.Context) (transfer, error) {
	dir, err := e.tempDir("cli-")
	if err != nil {
		return transfer{}, err
	}
	cmd := exec.CommandContext(ctx, "docker", e.dockerRunArgs(dir, ddCommand(e.c.sizeMiB)...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return transfer{}, err
	}
	if err := cmd.Start(); err != nil {
		return transfer{}, err
	}
	t, err := consume(out)
	return t, errors.Join(err, cmd.Wait())
}

// child runs the executor side of one path in a child process and returns
// what it reported and its peak RSS in MiB (getrusage ru_maxrss).
func (e *env) child(ctx context.Context, mode, serverURL string) (transfer, float64, error) {
	self, err := os.Executable()
	if err != nil {
		return transfer{}, 0, err
	}
	dir, err := e.tempDir(mode + "-")
	if err != nil {
		return transfer{}, 0, err
	}
	cmd := exec.CommandContext(ctx, self, childCommand,
		"-mode", mode, "-image", e.c.image, "-size", strconv.Itoa(e.c.sizeMiB),
		"-dir", dir, "-bench", e.c.benchID, "-server", serverURL, "-helpers-dir", e.c.helpersDir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var rssMiB float64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rssMiB = float64(ru.Maxrss) / 1024 // KiB on Linux
	}
	if err != nil {
		return transfer{}, rssMiB, fmt.Errorf("%w: %s", err, stderr.String())
	}
	var t transfer
	if err := json.Unmarshal(stdout.Bytes(), &t); err != nil {
		return transfer{}, rssMiB, fmt.Errorf("child output %q: %w", stdout.String(), err)
	}
	return t, rssMiB, nil
}

// childOptions are the flags of the executor child.
type childOptions struct {
	mode, image, dir, benchID, server, helpersDir string
	sizeMiB                                       int
}

// childMain is the executor child: it runs one large-output container and
// prints a JSON transfer on stdout.
func childMain(args []string) int {
	var o childOptions
	fs := flag.NewFlagSet(childCommand, flag.ContinueOnError)
	fs.StringVar(&o.mode, "mode", "", "backend or runtask")
	fs.StringVar(&o.image, "image", "", "image")
	fs.IntVar(&o.sizeMiB, "size", 0, "MiB of output")
	fs.StringVar(&o.dir, "dir", "", "scratch directory")
	fs.StringVar(&o.benchID, "bench", "", "bench label value")
	fs.StringVar(&o.server, "server", "", "control plane URL")
	fs.StringVar(&o.helpersDir, "helpers-dir", "", "the self-check's helpers (the bench's -helpers-dir)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var t transfer
	var err error
	switch o.mode {
	case "backend":
		t, err = childBackend(ctx, o)
	case "runtask":
		err = childRunTask(ctx, o)
	default:
		err = fmt.Errorf("unknown mode %q", o.mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(t); err != nil {
		return 1
	}
	return 0
}

// ddCommand writes size MiB of zeros to stdout inside the container.
func ddCommand(mib int) []string {
	return []string{"dd", "if=/dev/zero", "bs=1M", "count=" + strconv.Itoa(mib)}
}

// childBackend runs dd through the backend into a spool, with a consumer
// following the spool as RunTask's consumers do.
func childBackend(ctx context.Context, o childOptions) (transfer, error) {
	backend, err := docker.New(ctx)
	if err != nil {
		return transfer{}, err
	}
	defer backend.Close()
	out, err := spool.New(filepath.Join(o.dir, "stdout.log"))
	if err != nil {
		return transfer{}, err
	}
	defer out.Close()
	done := make(chan struct{})
	var got transfer
	var readErr error
	go func() {
		defer close(done)
		got, readErr = consume(out.NewReaderContext(ctx, 0))
	}()
	spec := sandbox.Spec{Image: o.image, Cmd: ddCommand(o.sizeMiB), Run: model.RunRef{RunID: "throughput"},
		Labels: map[string]string{labelBench: o.benchID}}
	h, err := backend.Start(ctx, spec, sandbox.DefaultPolicy(), sandbox.Streams{Stdout: out, Stderr: io.Discard})
	if err != nil {
		return transfer{}, err
	}
	res := h.Wait(ctx)
	out.Close()
	<-done
	return got, errors.Join(res.Err, h.Close(ctx), readErr)
}

// childRunTask runs dd through the bench's host (benchHostConfig) with the
// HTTP client and stream sender pointed at the parent's control plane.
func childRunTask(ctx context.Context, o childOptions) error {
	backend, err := docker.New(ctx)
	if err != nil {
		return err
	}
	defer backend.Close()
	store, err := persist.Open(ctx, "file://"+filepath.Join(o.dir, "store"))
	if err != nil {
		return err
	}
	defer store.Close()
	root := filepath.Join(o.dir, "runtime")
	layout, err := executor.NewLayout(root)
	if err != nil {
		return err
	}
	uids, err := uidpool.New(layout.UIDLeaseDir(), uidpool.DefaultRange())
	if err != nil {
		return err
	}
	host, err := executor.New(ctx, benchHostConfig(root, backend, store, uids, o.helpersDir, o.image))
	if err != nil {
		return err
	}
	defer host.Close(context.WithoutCancel(ctx))
	client := workerclient.New(o.server, bearer)
	_, err = host.Run(ctx, executor.Spec{
		Task:         &model.Task{ID: "bench", UserID: "bench", ConversationID: "bench"},
		Run:          &model.TaskRun{ID: "throughput", TaskID: "bench"},
		SessionID:    "bench",
		Updater:      client,
		StreamSender: client.Stream(),
		Command:      ddCommand(o.sizeMiB),
		Labels:       map[string]string{labelBench: o.benchID},
	})
	return err
}
