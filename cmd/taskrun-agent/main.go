// Command taskrun-agent is the reference agent runtime that runs inside a
// taskrun container.
//
// With TASKRUN_MODEL_SOCKET unset it runs an offline routine: it reads
// AGENTS.md and the prompt, prints progress, lists the workspace, writes
// artifacts/report.md, output/result.md, a JSONL trace under
// global/traces/<session>/rt_<run>.jsonl and its session state in
// home/.taskrun-agent. With the socket set it runs a tool-using loop over the
// model gateway's chat completions API.
//
// It is built static (CGO_ENABLED=0) so it runs in a FROM scratch image.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "taskrun-agent: %v\n", err)
		if errors.Is(err, errBadConfig) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// run parses the configuration and runs the routine it selects, tracing it.
func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) (err error) {
	c, err := parseConfig(args, getenv)
	if err != nil {
		return err
	}
	tr, err := openTracer(c.tracePath())
	if err != nil {
		return err
	}
	defer func() {
		if cerr := tr.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	mode := "offline"
	if c.ModelSocket != "" {
		mode = "model"
	}
	tr.Event("run_start", map[string]any{"run_id": c.RunID, "task_id": c.TaskID, "session_id": c.SessionID, "mode": mode})
	defer func() {
		end := map[string]any{"ok": err == nil}
		if err != nil {
			end["error"] = err.Error()
		}
		tr.Event("run_end", end)
	}()
	if mode == "model" {
		return runModel(ctx, c, out, tr)
	}
	return runOffline(ctx, c, out, tr)
}
