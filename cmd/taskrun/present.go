package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/termsafe"
)

// writeSummary prints where a finished run's results are. code is the
// process's exit status, which the summary repeats. Everything that came
// from the run (reason, keys) is escaped for the terminal.
func writeSummary(w io.Writer, ref runRefFlags, store string, out *executor.Outcome, code int) {
	if out == nil {
		return
	}
	res := out.Result
	fmt.Fprintf(w, "\nrun %s: %s", ref.runID, out.Status)
	if out.ContainerID != "" {
		fmt.Fprintf(w, " (exit %d", code)
		if !out.Exit.StartedAt.IsZero() && !out.Exit.FinishedAt.IsZero() {
			fmt.Fprintf(w, ", %s", out.Exit.FinishedAt.Sub(out.Exit.StartedAt).Round(10*time.Millisecond))
		}
		fmt.Fprint(w, ")")
	}
	fmt.Fprintln(w)
	if out.Reason != "" {
		fmt.Fprintf(w, "  reason:    %s\n", termsafe.String(out.Reason))
	}
	if out.DroppedOutputBytes > 0 {
		fmt.Fprintf(w, "  output:    %d bytes past --max-output were dropped\n", out.DroppedOutputBytes)
	}
	if res.PromptTokens != nil && res.CompletionTokens != nil {
		fmt.Fprintf(w, "  tokens:    %d prompt, %d completion (metered by the gateway)\n", *res.PromptTokens, *res.CompletionTokens)
	}
	if key := traceKey(out, ref.user); key != "" {
		fmt.Fprintf(w, "  trace:     %s\n", termsafe.String(key))
	}
	if c := out.Changes; c != nil {
		fmt.Fprintf(w, "  changes:   %d files (%d added, %d deleted, %d modified, %d renamed, %d mode), +%d -%d lines: taskrun diff %s\n",
			c.Files, c.Added, c.Deleted, c.Modified, c.Renamed, c.ModeChanged, c.Insertions, c.Deletions, ref.runID)
	}
	if len(out.Stored) > 0 {
		fmt.Fprintf(w, "  stored in %s:\n", termsafe.String(store))
		for _, o := range out.Stored {
			fmt.Fprintf(w, "    %-90s %8d bytes\n", termsafe.String(o.Key), o.Size)
		}
	}
}

// traceKey is the store key of the run's trace: the stored object whose key
// is the trace path in the tenant's run-global storage (or ends in it). It is
// empty when the run stored no trace.
func traceKey(out *executor.Outcome, user string) string {
	rel := out.Result.TracePath
	if rel == "" {
		return ""
	}
	want, err := persist.GlobalKey(user, rel)
	if err != nil {
		want = ""
	}
	for _, o := range out.Stored {
		if o.Key == want {
			return o.Key
		}
	}
	for _, o := range out.Stored {
		if strings.HasSuffix(o.Key, "/"+rel) {
			return o.Key
		}
	}
	return ""
}
