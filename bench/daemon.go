package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/taskrun/taskrun/daemon"
)

// daemonTarget is the daemon's goal: `taskrun run -- true` through a
// resident daemon no slower than `docker run --rm` with the same policy
// flags, with no warm pool; daemonWarmTarget is its goal for a warm hit.
const (
	daemonTarget     = 1.0
	daemonWarmTarget = 0.5
)

// daemonCLI compares `taskrun run -- true` through a `taskrun daemon`
// (default flags: self-check, audit, disk cap, own uid), the same command
// in-process (--local, gc at start) and `docker run --rm` with taskrun's
// policy as flags (dockerRunArgs), in interleaved triples; each ratio is
// the median of the triples' ratios.
func daemonCLI(ctx context.Context, e *env) ([]row, error) {
	bin, err := e.taskrunBinary()
	if err != nil {
		return nil, err
	}
	dir, err := e.tempDir("daemon-")
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "taskrun.sock")
	cenv := append(os.Environ(), daemon.EnvSocket+"="+sock)
	stop, err := startDaemon(ctx, bin, cenv, sock, dir, "cold", e.c.image)
	if err != nil {
		return nil, err
	}
	defer stop()
	lstore := "file://" + filepath.Join(dir, "local-store")
	run := func(local bool) variant {
		return func(ctx context.Context, e *env, i int) (time.Duration, error) {
			args := []string{"--quiet", "run", "--run-id", fmt.Sprintf("%s-d%v-%d", e.c.benchID, local, i), "--json"}
			if local {
				args = append(args, "--local", "--root", filepath.Join(dir, "local-runs"), "--store", lstore, "--image", e.c.image)
			}
			cmd := exec.CommandContext(ctx, bin, append(args, "--", "true")...)
			cmd.Env = cenv
			cmd.Stderr = io.Discard
			start := time.Now()
			out, err := cmd.Output()
			took := time.Since(start)
			if err != nil {
				return 0, fmt.Errorf("taskrun run (local %v): %w: %s", local, err, out)
			}
			var res struct {
				Status string `json:"status"`
			}
			if err := json.Unmarshal(out, &res); err != nil || res.Status != "SUCCEEDED" {
				return 0, fmt.Errorf("taskrun run (local %v) ended %q: %v", local, res.Status, err)
			}
			return took, nil
		}
	}
	dockerRun := func(ctx context.Context, e *env, _ int) (time.Duration, error) {
		bind, err := e.tempDir("daemon-docker-")
		if err != nil {
			return 0, err
		}
		start := time.Now()
		out, err := exec.CommandContext(ctx, "docker", e.dockerRunArgs(bind, "true")...).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("docker run: %w: %s", err, out)
		}
		return time.Since(start), nil
	}
	// Warm-up triple, not measured: helpers unpacked, image inspected.
	for _, v := range []variant{dockerRun, run(false), run(true)} {
		if _, err := v(ctx, e, -1); err != nil {
			return nil, err
		}
	}
	ds, err := alternate(ctx, e, e.c.runs, dockerRun, run(false), run(true))
	if err != nil {
		return nil, err
	}
	n := fmt.Sprintf(" (median ratio of %d interleaved triples)", e.c.runs)
	viaDaemon := pairRatio(ds[1], ds[0])
	stop()

	// The same through a daemon keeping one container warm: each run
	// claims it.
	wsock := filepath.Join(dir, "warm.sock")
	cenv = append(os.Environ(), daemon.EnvSocket+"="+wsock)
	stopWarm, err := startDaemon(ctx, bin, cenv, wsock, dir, "warm", e.c.image, "--warm", "1")
	if err != nil {
		return nil, err
	}
	defer stopWarm()
	if _, err := run(false)(ctx, e, -2); err != nil {
		return nil, err
	}
	// Let the pool park its container before the first measured run.
	time.Sleep(3 * time.Second)
	// Each warm run waits (unmeasured) for the refill to finish, so that
	// the refill does not load the docker run that follows.
	warmRun := func(ctx context.Context, e *env, i int) (time.Duration, error) {
		d, err := run(false)(ctx, e, i)
		time.Sleep(1500 * time.Millisecond)
		return d, err
	}
	wds, err := alternate(ctx, e, e.c.runs, dockerRun, warmRun)
	if err != nil {
		return nil, err
	}
	viaWarm := pairRatio(wds[1], wds[0])
	return []row{
		{
			what:     "`taskrun run -- true` through `taskrun daemon --warm 1`" + fmt.Sprintf(" (median ratio of %d interleaved pairs)", e.c.runs),
			taskrun:  fmtDuration(median(wds[1])),
			baseline: "docker run --rm, same policy flags: " + fmtDuration(median(wds[0])),
			ratio:    fmt.Sprintf("%.2f×", viaWarm),
			target:   fmt.Sprintf("≤ %.2f×", daemonWarmTarget),
			verdict:  verdict(viaWarm <= daemonWarmTarget),
		},
		{
			what:     "`taskrun run -- true` through `taskrun daemon` (no warm pool)" + n,
			taskrun:  fmtDuration(median(ds[1])),
			baseline: "docker run --rm, same policy flags: " + fmtDuration(median(ds[0])),
			ratio:    fmt.Sprintf("%.2f×", viaDaemon),
			target:   fmt.Sprintf("≤ %.2f×", daemonTarget),
			verdict:  verdict(viaDaemon <= daemonTarget),
		},
		{
			what:     "`taskrun run --local -- true` in-process, gc at start" + n,
			taskrun:  fmtDuration(median(ds[2])),
			baseline: "docker run --rm, same policy flags: " + fmtDuration(median(ds[0])),
			ratio:    fmt.Sprintf("%.2f×", pairRatio(ds[2], ds[0])),
		},
		{
			what:     "through the daemon against in-process" + n,
			taskrun:  fmtDuration(median(ds[1])),
			baseline: "taskrun run --local: " + fmtDuration(median(ds[2])),
			ratio:    fmt.Sprintf("%.2f×", pairRatio(ds[1], ds[2])),
		},
	}, nil
}

// startDaemon starts `taskrun daemon` with its root and store under dir
// (named by name) and waits until it serves at sock; stop ends it (once).
func startDaemon(ctx context.Context, bin string, env []string, sock, dir, name, image string, extra ...string) (stop func(), err error) {
	args := append([]string{"--quiet", "daemon", "--root", filepath.Join(dir, name+"-runs"), "--store", "file://" + filepath.Join(dir, name+"-store"), "--image", image}, extra...)
	d := exec.Command(bin, args...)
	d.Env = env
	d.Stdout, d.Stderr = io.Discard, io.Discard
	if err := d.Start(); err != nil {
		return nil, err
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = d.Process.Signal(syscall.SIGTERM)
			_ = d.Wait()
		})
	}
	if err := waitSocket(ctx, sock); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// pairRatio is the median of got[i]/base[i].
func pairRatio(got, base []time.Duration) float64 {
	r := make([]float64, len(got))
	for i := range got {
		r[i] = float64(got[i]) / float64(base[i])
	}
	return medianF(r)
}

// waitSocket waits until the daemon serves at sock: a request answered,
// not just a connection (it listens before it has recovered).
func waitSocket(ctx context.Context, sock string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		c, err := net.Dial("unix", sock)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, err = io.WriteString(c, "GET /v1/ HTTP/1.1\r\nHost: taskrun\r\nConnection: close\r\n\r\n")
			if err == nil {
				var buf [16]byte
				n, _ := c.Read(buf[:])
				if strings.HasPrefix(string(buf[:n]), "HTTP/1.1") {
					c.Close()
					return nil
				}
			}
			c.Close()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("taskrun daemon at %s never answered", sock)
}
