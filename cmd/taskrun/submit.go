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
	"github.com/taskrun/taskrun/egress"
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

Everything after the first argument that is not a flag is the command to run
instead of the image's default, as for taskrun run. --env, --allow,
--egress-policy and the limits are passed to the worker as they are; the
worker's own settings apply to what is not given. Credentials for the egress
proxy are the worker operator's to configure: --credential is not offered here.
`

func init() {
	register(&command{
		Name:          "submit",
		Synopsis:      "submit a task to a control plane (taskrun serve)",
		Args:          "[--] [CMD [ARGS...]]",
		Help:          submitHelp,
		StopAtCommand: true,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				api               userAPIFlags
				req               controlplane.SubmitRequest
				promptFile, wsDir string
				timeout           time.Duration
				wait              bool
				memory            int64
				envVars, envFiles []string
				allows            []string
				egressFile        string
				lim               workerclient.Limits
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
			fs.Float64Var(&lim.CPUs, "cpus", 0, "CPU limit (default: the worker's)")
			fs.Int64Var(&lim.PIDs, "pids", 0, "process limit (default: the worker's)")
			addSizeFlag(fs, &lim.DiskBytes, "disk", "cap on what the run may store under /taskrun (default: the worker's)")
			addSizeFlag(fs, &lim.MaxOutputBytes, "max-output", "cap on the output kept from the run (default: the worker's)")
			fs.Int64Var(&lim.MaxTokens, "max-tokens", 0, "fail the run once it has used this many tokens (0: no cap)")
			fs.StringArrayVar(&envVars, "env", nil, "set NAME=VALUE in the agent's environment (a bare NAME takes this host's value); repeatable; visible to the agent, so never a secret")
			fs.StringArrayVar(&envFiles, "env-file", nil, "read variables from a file in docker's --env-file format; repeatable")
			fs.StringArrayVar(&allows, "allow", nil, "let the run reach HOST[:PORT] through its egress proxy (as taskrun run --allow); repeatable")
			fs.StringVar(&egressFile, "egress-policy", "", "JSON egress policy file (see docs/egress.md); its credentials are read on the worker")
			fs.BoolVar(&req.Retryable, "retryable", false, "run the task again if its worker is lost (only for tasks safe to repeat)")
			fs.BoolVar(&wait, "wait", false, "follow the output until the run ends; exit non-zero unless it succeeded")
			return func(ctx context.Context, a *app, args []string) int {
				req.Command = args
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
				if err := submitOptions(&req, envFiles, envVars, egressFile, allows); err != nil {
					return a.usageError("submit", err)
				}
				if lim.CPUs < 0 || lim.PIDs < 0 || lim.MaxTokens < 0 {
					return a.usageError("submit", errors.New("--cpus, --pids and --max-tokens: give a positive number, or leave the flag out for the worker's default"))
				}
				lim.TimeoutMillis, lim.MemoryBytes = timeout.Milliseconds(), memory
				req.Limits = lim
				return runSubmit(ctx, a, api, req, wsDir, wait)
			}
		},
	})
}

// submitOptions puts the environment and the egress policy into req, checked
// as taskrun run checks them.
func submitOptions(req *controlplane.SubmitRequest, envFiles, envVars []string, egressFile string, allows []string) error {
	env, err := readEnv(envFiles, envVars, os.LookupEnv)
	if err != nil {
		return err
	}
	req.Env = env
	pol, err := egress.BuildPolicy(egressFile, allows, nil)
	if err != nil {
		return err
	}
	if !pol.IsZero() {
		if req.Egress, err = json.Marshal(pol); err != nil {
			return fmt.Errorf("egress policy: %w", err)
		}
	}
	return nil
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
