package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/workerclient"
)

// logUpdater is the TaskRunUpdater used without --server: it logs each status
// change in one line. The output itself is already on the terminal.
type logUpdater struct{ log *slog.Logger }

func (u logUpdater) UpdateRunStatus(_ context.Context, runID string, req *workerclient.PatchTaskRunRequest) error {
	attrs := []any{"run", runID, "status", req.Status}
	if req.Container != nil {
		attrs = append(attrs, "container", shortID(req.Container.ID))
	}
	if req.ExitCode != nil {
		attrs = append(attrs, "exit_code", *req.ExitCode)
	}
	if req.Error != nil {
		attrs = append(attrs, "reason", *req.Error)
	}
	u.log.Info("run status", attrs...)
	return nil
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// writeSummary prints where a finished run's results are.
func writeSummary(w io.Writer, runID, store string, out *taskrun.Outcome) {
	if out == nil {
		return
	}
	res := out.Result
	fmt.Fprintf(w, "\nrun %s: %s", runID, out.Status)
	if out.ContainerID != "" {
		fmt.Fprintf(w, " (exit %d", out.Exit.ExitCode)
		if !out.Exit.StartedAt.IsZero() && !out.Exit.FinishedAt.IsZero() {
			fmt.Fprintf(w, ", %s", out.Exit.FinishedAt.Sub(out.Exit.StartedAt).Round(10*time.Millisecond))
		}
		fmt.Fprint(w, ")")
	}
	fmt.Fprintln(w)
	if out.Reason != "" {
		fmt.Fprintf(w, "  reason:    %s\n", out.Reason)
	}
	if out.DroppedOutputBytes > 0 {
		fmt.Fprintf(w, "  output:    %d bytes past --max-output were dropped\n", out.DroppedOutputBytes)
	}
	if res.PromptTokens != nil {
		fmt.Fprintf(w, "  tokens:    %d prompt, %d completion (metered by the gateway)\n", *res.PromptTokens, *res.CompletionTokens)
	}
	if res.TracePath != "" {
		fmt.Fprintf(w, "  trace:     %s\n", res.TracePath)
	}
	if len(out.Stored) > 0 {
		fmt.Fprintf(w, "  stored in %s:\n", store)
		for _, o := range out.Stored {
			fmt.Fprintf(w, "    %-90s %8d bytes\n", o.Key, o.Size)
		}
	}
}
