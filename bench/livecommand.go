package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/taskrun/taskrun/daemon"
)

// liveCommands is how many commands each side of the live-run round trip
// runs.
const liveCommands = 50

// liveCommand compares a command's round trip in a live run through the
// daemon's process API (daemon.Client.Exec: start, stream, exit, record)
// with `docker exec` of the same command, as the run's user, in the same
// container, in interleaved pairs.
func liveCommand(ctx context.Context, e *env) ([]row, error) {
	bin, err := e.taskrunBinary()
	if err != nil {
		return nil, err
	}
	dir, err := e.tempDir("live-")
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "taskrun.sock")
	stop, err := startDaemon(ctx, bin, append(os.Environ(), daemon.EnvSocket+"="+sock), sock, dir, "live", e.c.image)
	if err != nil {
		return nil, err
	}
	defer stop()
	c, err := daemon.Dial(ctx, sock)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	runID := e.c.benchID + "-live"
	if err := c.Start(ctx, daemon.RunRequest{RunID: runID, Conversation: "bench", Task: "live", Session: "bench", Image: e.c.image}, ""); err != nil {
		return nil, err
	}
	defer func() { _ = c.Stop(context.WithoutCancel(ctx), runID) }()
	return execAgainstDocker(ctx, e, runID, fmt.Sprintf("`true` in a live run through the daemon's process API (%d interleaved pairs)", liveCommands),
		func(ctx context.Context, _ *env, _ int) (time.Duration, error) {
			start := time.Now()
			res, err := c.Exec(ctx, runID, daemon.ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard)
			if err == nil && res.Exit != 0 {
				err = fmt.Errorf("exit %d %s", res.Exit, res.Error)
			}
			return time.Since(start), err
		})
}

// execAgainstDocker times api, a command round trip into the live run
// runID, against `docker exec` of `true` in the same container as the same
// user, in interleaved pairs after one warm-up each, as one row.
func execAgainstDocker(ctx context.Context, e *env, runID, what string, api variant) ([]row, error) {
	out, err := exec.CommandContext(ctx, "docker", "ps", "-q", "--filter", "label=dev.taskrun.run="+runID).Output()
	if err != nil {
		return nil, fmt.Errorf("the live run's container: %w", err)
	}
	id := strings.TrimSpace(string(out))
	user, err := exec.CommandContext(ctx, "docker", "inspect", "-f", "{{.Config.User}}", id).Output()
	if err != nil || id == "" {
		return nil, fmt.Errorf("the live run's container %q: %v", id, err)
	}
	dockerExec := func(ctx context.Context, _ *env, _ int) (time.Duration, error) {
		start := time.Now()
		out, err := exec.CommandContext(ctx, "docker", "exec", "-u", strings.TrimSpace(string(user)), id, "true").CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("docker exec: %w: %s", err, out)
		}
		return time.Since(start), nil
	}
	for _, v := range []variant{dockerExec, api} {
		if _, err := v(ctx, e, -1); err != nil {
			return nil, err
		}
	}
	ds, err := alternate(ctx, e, liveCommands, dockerExec, api)
	if err != nil {
		return nil, err
	}
	dist := func(d []time.Duration) string {
		return fmt.Sprintf("median %s, p95 %s", fmtDuration(median(d)), fmtDuration(p95(d)))
	}
	return []row{{
		what:     what,
		taskrun:  dist(ds[1]),
		baseline: "docker exec, same container and user: " + dist(ds[0]),
		ratio:    fmt.Sprintf("%.2f×", pairRatio(ds[1], ds[0])),
	}}, nil
}
