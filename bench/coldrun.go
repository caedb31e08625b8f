package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"time"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
)

// dockerRunArgs is `docker run --rm` with taskrun's default policy as CLI
// flags, the bench labels and dir bind-mounted at /taskrun.
func (e *env) dockerRunArgs(dir string, cmd ...string) []string {
	args := []string{"run", "--rm",
		"--label", sandbox.LabelManaged + "=true",
		"--label", labelBench + "=" + e.c.benchID,
		"--user", "10001:10001",
		"--cap-drop", "ALL",
		"--security-opt", "no-new-privileges",
		"--read-only",
		"--tmpfs", "/tmp:rw,nosuid,nodev,size=64m",
		"--pids-limit", "256",
		"--memory", "1g", "--memory-swap", "1g",
		"--cpus", "1",
		"--network", "none",
		"--init",
		"--ipc", "private",
		"--log-opt", "max-size=10m",
		"--ulimit", "nofile=1024", "--ulimit", "core=0",
		"--mount", "type=bind,source=" + dir + ",target=/taskrun",
		e.c.image,
	}
	return append(args, cmd...)
}

// variant is one way of running a container, timed from the start call to
// the point the variant measures.
type variant func(ctx context.Context, e *env, i int) (time.Duration, error)

// alternate runs the variants round-robin n times and returns each one's
// durations; alternating spreads the machine's noise evenly.
func alternate(ctx context.Context, e *env, n int, vs ...variant) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(vs))
	for i := range n {
		for j, v := range vs {
			d, err := v(ctx, e, i)
			if err != nil {
				return out, err
			}
			out[j] = append(out[j], d)
		}
	}
	return out, nil
}

// coldRun compares whole runs of `true`: the backend (create, attach, start,
// wait, remove) and RunTask (plus materialize, persist, report) against
// `docker run --rm`.
func coldRun(ctx context.Context, e *env) ([]row, error) {
	ds, err := alternate(ctx, e, e.c.runs,
		func(ctx context.Context, e *env, _ int) (time.Duration, error) {
			dir, err := e.tempDir("cli-")
			if err != nil {
				return 0, err
			}
			start := time.Now()
			out, err := exec.CommandContext(ctx, "docker", e.dockerRunArgs(dir, "true")...).CombinedOutput()
			if err != nil {
				return 0, fmt.Errorf("docker run: %w: %s", err, out)
			}
			return time.Since(start), nil
		},
		func(ctx context.Context, e *env, _ int) (time.Duration, error) {
			return e.backendRun(ctx, sandbox.Streams{}, nil, "true")
		},
		func(ctx context.Context, e *env, i int) (time.Duration, error) {
			root, err := e.tempDir("runtask-")
			if err != nil {
				return 0, err
			}
			start := time.Now()
			err = e.runOn(ctx, nil, root, e.spec(fmt.Sprintf("cold-%d", i), &statusUpdater{}, "true"))
			return time.Since(start), err
		},
	)
	if err != nil {
		return nil, err
	}
	cli, backend, full := median(ds[0]), median(ds[1]), median(ds[2])
	n := fmt.Sprintf(" (median of %d)", e.c.runs)
	return []row{
		ratioRow("cold run `true`, sandbox/docker backend"+n, backend, cli, "docker run --rm", 1.05),
		ratioRow("cold run `true`, full RunTask"+n, full, cli, "docker run --rm", 0),
	}, nil
}

// backendRun runs cmd through the backend with the run dir bind-mounted and
// returns the time from Start to the end of Close, or to the moment first
// reports when first is non-nil.
func (e *env) backendRun(ctx context.Context, streams sandbox.Streams, first *firstByte, cmd ...string) (time.Duration, error) {
	dir, err := e.tempDir("backend-")
	if err != nil {
		return 0, err
	}
	spec := sandbox.Spec{Image: e.c.image, Cmd: cmd, Labels: e.labels, Run: model.RunRef{RunID: "bench"},
		Mounts: []sandbox.Mount{{Source: dir, Target: model.ContainerRunDir}}}
	start := time.Now()
	if first != nil {
		first.start = start
	}
	h, err := e.backend.Start(ctx, spec, sandbox.DefaultPolicy(), streams)
	if err != nil {
		return 0, err
	}
	res := h.Wait(ctx)
	err = errors.Join(res.Err, h.Close(ctx))
	d := time.Since(start)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit code %d", res.ExitCode)
	}
	if first != nil {
		d = first.latency()
	}
	return d, err
}

// firstByte is a writer that notes when its first byte arrives.
type firstByte struct {
	start time.Time
	once  sync.Once
	at    time.Time
	mu    sync.Mutex
}

func (f *firstByte) Write(p []byte) (int, error) {
	if len(p) > 0 {
		f.once.Do(func() {
			f.mu.Lock()
			f.at = time.Now()
			f.mu.Unlock()
		})
	}
	return len(p), nil
}

// latency is the time from start to the first byte; 0 when none came.
func (f *firstByte) latency() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at.IsZero() {
		return 0
	}
	return f.at.Sub(f.start)
}

// firstByte compares the time from the start call to the first stdout byte
// at the consumer, for `echo x`.
func firstByteLatency(ctx context.Context, e *env) ([]row, error) {
	ds, err := alternate(ctx, e, e.c.runs,
		dockerFirstByte,
		func(ctx context.Context, e *env, _ int) (time.Duration, error) {
			f := &firstByte{}
			d, err := e.backendRun(ctx, sandbox.Streams{Stdout: f}, f, "echo", "x")
			if err == nil && d == 0 {
				err = errors.New("backend run printed nothing")
			}
			return d, err
		},
		func(ctx context.Context, e *env, i int) (time.Duration, error) {
			root, err := e.tempDir("runtask-")
			if err != nil {
				return 0, err
			}
			f := &firstByte{start: time.Now()}
			spec := e.spec(fmt.Sprintf("first-%d", i), &statusUpdater{}, "echo", "x")
			spec.Stdout = f
			if err := e.runOn(ctx, nil, root, spec); err != nil {
				return 0, err
			}
			return f.latency(), nil
		},
	)
	if err != nil {
		return nil, err
	}
	cli, backend, full := median(ds[0]), median(ds[1]), median(ds[2])
	n := fmt.Sprintf(" (median of %d)", e.c.runs)
	return []row{
		ratioRow("first stdout byte, sandbox/docker backend"+n, backend, cli, "docker run --rm", 0),
		ratioRow("first stdout byte, full RunTask (live Stdout)"+n, full, cli, "docker run --rm", 0),
	}, nil
}

// dockerFirstByte times `docker run ... echo x` from its start to the first
// stdout byte at the consumer.
func dockerFirstByte(ctx context.Context, e *env, _ int) (time.Duration, error) {
	dir, err := e.tempDir("cli-")
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, "docker", e.dockerRunArgs(dir, "echo", "x")...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	var b [1]byte
	_, readErr := io.ReadFull(out, b[:])
	d := time.Since(start)
	_, _ = io.Copy(io.Discard, out)
	return d, errors.Join(readErr, cmd.Wait())
}
