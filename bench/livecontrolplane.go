package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/model"
)

// liveCommandControlPlane compares a command's round trip in a live run
// through the control plane's live API (`taskrun serve` proxying to a
// `taskrun worker --live-listen`, over loopback HTTP: start, stream, exit,
// record) with `docker exec` of the same command, as the run's user, in
// the same container, in interleaved pairs.
func liveCommandControlPlane(ctx context.Context, e *env) ([]row, error) {
	bin, err := e.taskrunBinary()
	if err != nil {
		return nil, err
	}
	dir, err := e.tempDir("live-cp-")
	if err != nil {
		return nil, err
	}
	cp, err := startServeAndWorker(ctx, bin, dir, e.c.image, e.c.helpersDir)
	if err != nil {
		return nil, err
	}
	defer cp.stop()
	var sub controlplane.SubmitResponse
	if err := cp.call(ctx, http.MethodPost, "/v1/tasks", controlplane.SubmitRequest{Prompt: "bench", Image: e.c.image, KeepAlive: true}, &sub); err != nil {
		return nil, fmt.Errorf("submit the live run: %w", err)
	}
	runID := sub.RunID
	defer func() {
		ctx := context.WithoutCancel(ctx)
		_ = cp.call(ctx, http.MethodPost, "/v1/runs/"+runID+"/cancel", nil, nil)
		cp.waitEnded(ctx, runID)
	}()
	if err := cp.waitRunning(ctx, runID); err != nil {
		return nil, err
	}
	return execAgainstDocker(ctx, e, runID, fmt.Sprintf("`true` in a live run through the control plane's live API, serve → worker (%d interleaved pairs)", liveCommands),
		func(ctx context.Context, _ *env, _ int) (time.Duration, error) {
			start := time.Now()
			err := cp.exec(ctx, runID, daemon.ExecRequest{Argv: []string{"true"}})
			return time.Since(start), err
		})
}

// serveAndWorker is a `taskrun serve` (SQLite, a file store) and one
// `taskrun worker` serving its live API, on loopback.
type serveAndWorker struct {
	url, token string
	procs      []*exec.Cmd
	once       sync.Once
}

// startServeAndWorker starts serve and a worker with their state under
// dir and waits until serve is ready and the worker has leased once.
func startServeAndWorker(ctx context.Context, bin, dir, image, helpersDir string) (*serveAndWorker, error) {
	cp := &serveAndWorker{token: "bench-" + rand.Text()}
	worker := "worker-" + rand.Text()
	wtok, utok := filepath.Join(dir, "w.tok"), filepath.Join(dir, "u.tok")
	if err := os.WriteFile(wtok, []byte(worker+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(utok, []byte("bench "+cp.token+"\n"), 0o600); err != nil {
		return nil, err
	}
	addrs := make([]string, 2)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addrs[i] = ln.Addr().String()
		ln.Close()
	}
	cp.url = "http://" + addrs[0]
	store := "file://" + filepath.Join(dir, "store")
	if err := cp.start(bin, filepath.Join(dir, "serve.log"), "serve", "--log-format", "json", "--listen", addrs[0],
		"--db", "sqlite://"+filepath.Join(dir, "cp.db"), "--store", store,
		"--worker-token-file", wtok, "--user-token-file", utok, "--lease-ttl", "4s"); err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, cp.url+"/readyz"); err != nil {
		cp.stop()
		return nil, err
	}
	args := []string{"worker", "--log-format", "json", "--server", cp.url, "--token-file", wtok, "--slots", "1",
		"--store", store, "--root", filepath.Join(dir, "root"), "--image", image,
		"--labels", "runtime=runc,image=" + image, "--drain-grace", "5s", "--lease-wait", "2s",
		"--live-listen", addrs[1], "--timeout", "30m"}
	if helpersDir != "" {
		args = append(args, "--helpers-dir", helpersDir)
	}
	if err := cp.start(bin, filepath.Join(dir, "worker.log"), args...); err != nil {
		cp.stop()
		return nil, err
	}
	return cp, nil
}

func (cp *serveAndWorker) start(bin, logPath string, args ...string) error {
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	go func() { _ = cmd.Wait(); logf.Close() }()
	cp.procs = append(cp.procs, cmd)
	return nil
}

// stop ends the worker, then serve (SIGTERM, SIGKILL after a minute).
func (cp *serveAndWorker) stop() {
	cp.once.Do(func() {
		for i := len(cp.procs) - 1; i >= 0; i-- {
			p := cp.procs[i].Process
			_ = p.Signal(syscall.SIGTERM)
			deadline := time.Now().Add(time.Minute)
			for p.Signal(syscall.Signal(0)) == nil && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			_ = p.Kill()
		}
	})
}

// call sends req (JSON, if not nil) as the bench's user and decodes the
// answer into resp (if not nil).
func (cp *serveAndWorker) call(ctx context.Context, method, path string, req, resp any) error {
	r, err := cp.request(ctx, method, path, req)
	if err != nil {
		return err
	}
	defer r.Body.Close()
	if resp == nil {
		_, _ = io.Copy(io.Discard, r.Body)
		return nil
	}
	return json.NewDecoder(r.Body).Decode(resp)
}

func (cp *serveAndWorker) request(ctx context.Context, method, path string, req any) (*http.Response, error) {
	var body io.Reader
	if req != nil {
		b, err := json.Marshal(req)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	r, err := http.NewRequestWithContext(ctx, method, cp.url+path, body)
	if err != nil {
		return nil, err
	}
	r.Header.Set("Authorization", "Bearer "+cp.token)
	r.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	return resp, nil
}

// exec runs a command in the live run to its end through the live API.
func (cp *serveAndWorker) exec(ctx context.Context, runID string, req daemon.ExecRequest) error {
	resp, err := cp.request(ctx, http.MethodPost, "/v1/runs/"+runID+"/exec", req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var fr daemon.Frame
		if err := dec.Decode(&fr); err != nil {
			return fmt.Errorf("the command's stream: %w", err)
		}
		if fr.Exec != nil {
			if fr.Exec.Exit != 0 || fr.Exec.Error != "" {
				return fmt.Errorf("exit %d %s", fr.Exec.Exit, fr.Exec.Error)
			}
			return nil
		}
	}
}

// waitRunning waits until the run's agent runs.
func (cp *serveAndWorker) waitRunning(ctx context.Context, runID string) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var run controlplane.Run
		if err := cp.call(ctx, http.MethodGet, "/v1/runs/"+runID, nil, &run); err != nil {
			return err
		}
		switch {
		case run.Status == model.StatusRunning && run.StartedAt != nil:
			return nil
		case run.Status != model.StatusRunning && run.Status != model.StatusQueued:
			return fmt.Errorf("live run %s ended before it ran: %s", runID, run.Status)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("live run %s: not running after 5m", runID)
}

// waitEnded waits (a minute at most) until the run is no longer live.
func (cp *serveAndWorker) waitEnded(ctx context.Context, runID string) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var run controlplane.Run
		if err := cp.call(ctx, http.MethodGet, "/v1/runs/"+runID, nil, &run); err != nil || (run.Status != model.StatusRunning && run.Status != model.StatusQueued) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitHTTP waits (a minute at most) until url answers 200.
func waitHTTP(ctx context.Context, url string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return errors.New(url + " never answered 200")
}
