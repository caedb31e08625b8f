package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workspace"
)

const submitHelp = `
Submits a task to a control plane (taskrun serve) and prints the new run's
ID. A worker leases the run and executes it. --workspace DIR is packed (as
taskrun packs a run's home: regular files, bounded) and uploaded with the
task. Without --conversation the task joins conversation "api"; without
--session its agent session is named after the task. With --wait, the run's output is followed until it ends, then its
status is printed and taskrun exits 0 only if the run succeeded.
`

func init() {
	register(&command{
		Name:     "submit",
		Synopsis: "submit a task to a control plane (taskrun serve)",
		Help:     submitHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				api               userAPIFlags
				req               controlplane.SubmitRequest
				promptFile, wsDir string
				timeout           time.Duration
				wait              bool
				memory            int64
			)
			api.define(fs)
			fs.StringVar(&req.Prompt, "prompt", "", "the instruction for the agent")
			fs.StringVar(&promptFile, "prompt-file", "", "read the prompt from this file (- for stdin)")
			fs.StringVar(&wsDir, "workspace", "", "directory to upload as the run's starting workspace")
			fs.StringVar(&req.Model, "model", "", "model entry (e.g. scripted, openai:gpt-4.1); default: the worker's")
			fs.StringVar(&req.Image, "image", "", "agent image; default: the worker's")
			fs.StringVar(&req.Runtime, "runtime", "", "OCI runtime (runc, runsc); default: the worker's")
			fs.StringVar(&req.ConversationID, "conversation", "", "conversation ID")
			fs.StringVar(&req.SessionID, "session", "", "agent session ID")
			fs.StringVar(&req.PreviousRunID, "resume", "", "ID of an earlier run of yours whose session this run resumes")
			fs.DurationVar(&timeout, "timeout", 0, "run timeout (default: the worker's)")
			addSizeFlag(fs, &memory, "memory", "memory limit (default: the worker's)")
			fs.BoolVar(&req.Retryable, "retryable", false, "run the task again if its worker is lost (only for tasks safe to repeat)")
			fs.BoolVar(&wait, "wait", false, "follow the output until the run ends; exit non-zero unless it succeeded")
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) > 0 {
					return a.usageError("submit", fmt.Errorf("unexpected argument %q", args[0]))
				}
				if api.server == "" {
					return a.usageError("submit", errors.New("--server is required"))
				}
				if promptFile != "" {
					b, err := readPromptFile(promptFile)
					if err != nil {
						return a.usageError("submit", err)
					}
					req.Prompt = string(b)
				}
				if req.Prompt == "" {
					return a.usageError("submit", errors.New("give --prompt or --prompt-file"))
				}
				req.Limits = workerclient.Limits{TimeoutMillis: timeout.Milliseconds(), MemoryBytes: memory}
				return runSubmit(ctx, a, api, req, wsDir, wait)
			}
		},
	})
}

func readPromptFile(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("--prompt-file: %w", err)
	}
	return b, nil
}

func runSubmit(ctx context.Context, a *app, api userAPIFlags, req controlplane.SubmitRequest, wsDir string, wait bool) int {
	c, err := api.client()
	if err != nil {
		return a.usageError("submit", err)
	}
	var ws io.Reader
	if wsDir != "" {
		if st, err := os.Stat(wsDir); err != nil || !st.IsDir() {
			return a.usageError("submit", fmt.Errorf("--workspace %s: not a directory", wsDir))
		}
		pr, pw := io.Pipe()
		go func() {
			stats, err := workspace.PackHome(ctx, wsDir, pw, workspace.PackOptions{Exclude: workspace.DefaultExcludes})
			if err == nil && len(stats.Skipped) > 0 {
				a.log.Warn("some workspace entries were not uploaded", "skipped", len(stats.Skipped), "first", stats.Skipped[0])
			}
			pw.CloseWithError(err)
		}()
		defer pr.Close()
		ws = pr
	}
	sub, err := c.Submit(ctx, req, ws)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun submit:", err)
		return exitFailure
	}
	fmt.Fprintln(a.stdout, sub.RunID)
	if !wait {
		return exitOK
	}
	out, flush := a.terminalSafe(a.stdout)
	rc, err := c.Output(ctx, sub.RunID, 0, true)
	if err == nil {
		_, err = io.Copy(out, rc)
		rc.Close()
	}
	_ = flush()
	if err != nil && ctx.Err() == nil {
		a.log.Warn("output follow ended early", "err", err)
	}
	run, err := c.Wait(ctx, sub.RunID, time.Second)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun submit:", err)
		return exitFailure
	}
	return printRemoteStatus(a, run)
}

// printRemoteStatus prints a finished run's status line to stderr and returns
// the exit status: 0 only for SUCCEEDED.
func printRemoteStatus(a *app, run controlplane.Run) int {
	if !a.quiet {
		b, _ := json.Marshal(map[string]any{"run": run.ID, "status": run.Status, "error": run.Error, "exit_code": run.ExitCode})
		fmt.Fprintln(a.stderr, string(b))
	}
	if run.Status == model.StatusSucceeded {
		return exitOK
	}
	return exitFailure
}
