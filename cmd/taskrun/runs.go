package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
)

const runsHelp = `
Lists runs from the store's run index, newest first. Every run writes its
record to tenants/USER/index/ when it starts and again when it ends, so a run
in progress shows as RUNNING. --user, --task and --status keep only the runs
that match. --json prints a JSON array of run records (the objects
'taskrun inspect --json' prints).
` + daemonReadHelp

func init() {
	register(&command{
		Name:     "runs",
		Synopsis: "list runs, newest first, from the store's run index",
		Help:     runsHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				store, user, task, status string
				limit                     int
				jsonOut                   bool
				api                       userAPIFlags
				via                       daemonReadFlags
			)
			addStoreFlag(fs, &store)
			api.define(fs)
			via.define(fs)
			fs.StringVar(&user, "user", "", "user (tenant) ID")
			fs.StringVar(&task, "task", "", "task ID")
			fs.StringVar(&status, "status", "", "only runs with this status: RUNNING, SUCCEEDED, FAILED or CANCELLED")
			fs.IntVar(&limit, "limit", 50, "list at most this many runs (0: all)")
			fs.BoolVar(&jsonOut, "json", false, "print a JSON array of run records")
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) > 0 {
					return a.usageError("runs", fmt.Errorf("unexpected argument %q", args[0]))
				}
				if api.server != "" {
					return listRemoteRuns(ctx, a, api, model.RunStatus(strings.ToUpper(status)), limit, jsonOut)
				}
				f := runindex.Filter{UserID: user, TaskID: task, Status: model.RunStatus(strings.ToUpper(status)), Limit: max(limit, 0)}
				if err := checkRunsFilter(f); err != nil {
					return a.usageError("runs", err)
				}
				c, code := via.dial(ctx, a, "runs")
				if code != exitOK {
					return code
				}
				if c != nil {
					defer c.Close()
					recs, err := c.Records(ctx, f)
					if err != nil {
						return a.daemonError("runs", err)
					}
					return printRuns(a, recs, jsonOut)
				}
				return listRuns(ctx, a, store, f, jsonOut)
			}
		},
	})
}

func checkRunsFilter(f runindex.Filter) error {
	if f.UserID != "" {
		if err := model.ValidateID("--user user", f.UserID); err != nil {
			return err
		}
	}
	if f.TaskID != "" {
		if err := model.ValidateID("--task task", f.TaskID); err != nil {
			return err
		}
	}
	switch f.Status {
	case "", model.StatusRunning, model.StatusSucceeded, model.StatusFailed, model.StatusCancelled:
		return nil
	}
	return fmt.Errorf("--status %q: use RUNNING, SUCCEEDED, FAILED or CANCELLED", f.Status)
}

func listRuns(ctx context.Context, a *app, storeURL string, f runindex.Filter, jsonOut bool) int {
	st, err := persist.Open(ctx, storeURL)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun runs: --store:", err)
		return exitCannotRun
	}
	defer st.Close()
	recs, err := runindex.List(ctx, st, f)
	if err != nil {
		return a.storeError("runs", err)
	}
	return printRuns(a, recs, jsonOut)
}

// printRuns prints the listed runs, as a table or (jsonOut) a JSON array.
func printRuns(a *app, recs []runindex.Record, jsonOut bool) int {
	if jsonOut {
		if recs == nil {
			recs = []runindex.Record{}
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(recs); err != nil {
			return exitFailure
		}
		return exitOK
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tUSER\tTASK\tSTATUS\tSTARTED\tDURATION\tEXIT\tTOKENS")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.RunID, r.UserID, r.TaskID, r.Status,
			r.Start.Local().Format(time.DateTime), duration(r), exitText(r.ExitCode), tokens(r))
	}
	if err := tw.Flush(); err != nil {
		return exitFailure
	}
	return exitOK
}

// listRemoteRuns lists the user's runs on a control plane.
func listRemoteRuns(ctx context.Context, a *app, api userAPIFlags, status model.RunStatus, limit int, jsonOut bool) int {
	c, err := api.client()
	if err != nil {
		return a.usageError("runs", err)
	}
	runs, err := c.ListRuns(ctx, status, min(max(limit, 0), controlplane.MaxListLimit))
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun runs:", err)
		return exitFailure
	}
	if jsonOut {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(runs); err != nil {
			return exitFailure
		}
		return exitOK
	}
	out, flush := a.terminalSafe(a.stdout) // errors may quote what an agent wrote
	defer flush()
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tTASK\tSTATUS\tQUEUED\tWORKER\tEPOCH\tEXIT\tTOKENS\tERROR")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d+%d\t%s\n", r.ID, r.Task.ID, r.Status, r.CreatedAt.Local().Format(time.DateTime),
			orDash(r.WorkerID), r.Epoch, exitText(r.ExitCode), r.PromptTokens, r.CompletionTokens, orDash(r.Error))
	}
	if err := tw.Flush(); err != nil {
		return exitFailure
	}
	return exitOK
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func duration(r runindex.Record) string {
	if r.End.IsZero() {
		return "-"
	}
	return (time.Duration(r.DurationMS) * time.Millisecond).Round(100 * time.Millisecond).String()
}

func exitText(code *int) string {
	if code == nil {
		return "-"
	}
	return fmt.Sprint(*code)
}

func tokens(r runindex.Record) string {
	if r.PromptTokens == nil && r.CompletionTokens == nil {
		return "-"
	}
	var p, c int
	if r.PromptTokens != nil {
		p = *r.PromptTokens
	}
	if r.CompletionTokens != nil {
		c = *r.CompletionTokens
	}
	return fmt.Sprintf("%d+%d", p, c)
}
