package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	units "github.com/docker/go-units"
	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/termsafe"
	"github.com/taskrun/taskrun/timings"
)

const inspectHelp = `
Prints a run's record from the store's run index: status, reason, exit code,
times, tokens, image digest, runtime, limits, the isolation verdict, the
change set's summary and every stored object. --json prints the record as
stored (see README, "Inspecting runs").
`

func init() {
	register(&command{
		Name:     "inspect",
		Synopsis: "print a run's record: status, reason, limits, image, tokens, stored objects",
		Args:     "RUN",
		Help:     inspectHelp + runLookupHelp + serverReadHelp + daemonReadHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				run     readRunFlags
				jsonOut bool
			)
			run.define(fs)
			fs.BoolVar(&jsonOut, "json", false, "print the run's record as JSON")
			return func(ctx context.Context, a *app, args []string) int {
				runID, ok := a.oneRunArg("inspect", args)
				if !ok {
					return exitUsage
				}
				rr, code := run.open(ctx, a, "inspect", runID)
				if rr == nil {
					return code
				}
				defer rr.Close()
				rec := rr.rec
				execs, err := rr.execs(ctx)
				if err != nil {
					return a.readError("inspect", err)
				}
				rec.Execs = execs
				if jsonOut {
					enc := json.NewEncoder(a.stdout)
					enc.SetIndent("", "  ")
					if err := enc.Encode(rec); err != nil {
						return exitFailure
					}
					return exitOK
				}
				writeRecord(a.stdout, rec)
				return exitOK
			}
		},
	})
}

// writeRecord prints rec for a person; agent-influenced text is escaped.
func writeRecord(w io.Writer, r *runindex.Record) {
	line := func(k, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-14s %s\n", k+":", termsafe.String(v))
		}
	}
	line("Run", r.RunID)
	line("User", r.UserID)
	line("Conversation", r.ConversationID)
	line("Task", r.TaskID)
	line("Session", r.SessionID)
	line("Status", string(r.Status))
	line("Reason", r.Reason)
	line("Exit code", exitText(r.ExitCode))
	line("Started", r.Start.Local().Format(time.RFC3339))
	if !r.End.IsZero() {
		line("Ended", r.End.Local().Format(time.RFC3339))
		line("Duration", duration(*r))
	}
	line("Tokens", tokens(*r))
	line("Image", r.Image)
	line("Image digest", r.ImageDigest)
	line("Runtime", r.Runtime)
	line("Container", r.ContainerName)
	line("Host", r.Host)
	line("Isolation", r.Isolation)
	line("Resources", usageText(r.Usage))
	if len(r.Limits) > 0 {
		var parts []string
		for _, k := range sortedKeys(r.Limits) {
			parts = append(parts, fmt.Sprintf("%s=%v", k, r.Limits[k]))
		}
		line("Limits", strings.Join(parts, " "))
	}
	if c := r.Changes; c != nil {
		s := c.Summary
		line("Changes", fmt.Sprintf("%d files (%d added, %d deleted, %d modified, %d renamed, %d mode), +%d -%d lines",
			s.Files, s.Added, s.Deleted, s.Modified, s.Renamed, s.ModeChanged, s.Insertions, s.Deletions))
		line("Base commit", c.BaseCommit)
		line("Tree hash", c.TreeHash)
	}
	for _, e := range r.Execs {
		line("Exec", fmt.Sprintf("%s by %s: %q exit %d", e.At.Local().Format(time.RFC3339), e.By, e.Command, e.Exit))
	}
	if len(r.Timings) > 0 {
		fmt.Fprintf(w, "Timings:       %.1f ms in all (start and duration of each phase, ms)\n", timings.Total(r.Timings))
		for _, s := range r.Timings {
			fmt.Fprintf(w, "  %-14s %9.1f %9.1f\n", termsafe.String(s.Phase), s.StartMS, s.DurationMS)
		}
	}
	if len(r.Stored) > 0 {
		fmt.Fprintln(w, "Stored:")
		for _, o := range r.Stored {
			fmt.Fprintf(w, "  %s  %d bytes  sha256:%s\n", termsafe.String(o.Key), o.Size, o.SHA256)
		}
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// usageText is what the run's container used, as its backend sampled it;
// empty when it was not sampled.
func usageText(u *sandbox.Usage) string {
	if u == nil {
		return ""
	}
	return fmt.Sprintf("CPU %.2f s, peak memory %s, I/O %s read %s written, peak %d processes (%d samples)",
		u.CPUSeconds, units.BytesSize(float64(u.PeakMemoryBytes)), units.BytesSize(float64(u.ReadBytes)),
		units.BytesSize(float64(u.WriteBytes)), u.PeakPids, u.Samples)
}
