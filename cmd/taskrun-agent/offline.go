package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// maxListed bounds how many workspace entries the offline routine lists.
const maxListed = 200

// runOffline is the agent's routine when no model is configured: it reads its
// inputs, reports progress, looks at the workspace and writes a report, the
// result and its session state, all without a network.
func runOffline(ctx context.Context, c agentConfig, out io.Writer, tr *tracer) error {
	session, err := loadSession(c.stateDir())
	if err != nil {
		return err
	}
	progress := newProgress(ctx, out, tr, c.Step)

	agentsMD := readOptional(c.AgentsMD)
	prompt := readOptional(c.PromptFile)
	progress.say("reading AGENTS.md (%d bytes) and the prompt (%d bytes)", len(agentsMD), len(prompt))

	resumed := session.RunCount > 0
	if resumed {
		progress.say("resuming session %s: %d earlier run(s), last %s", c.SessionID, session.RunCount, session.Runs[len(session.Runs)-1].RunID)
	} else {
		progress.say("starting session %s", c.SessionID)
	}

	entries, err := listTree(c.Home, maxListed)
	if err != nil {
		return err
	}
	progress.say("listed the workspace: %d entries", len(entries))
	tr.Event("workspace_listed", map[string]any{"entries": entries})

	session, err = recordRun(c.stateDir(), session, c, "offline")
	if err != nil {
		return err
	}
	report := offlineReport(c, prompt, entries, session)
	reportPath := filepath.Join(c.Artifacts, "report.md")
	if err := writeFileAtomic(reportPath, []byte(report)); err != nil {
		return err
	}
	progress.say("wrote artifact %s", reportPath)
	tr.Event("artifact_written", map[string]any{"path": reportPath, "bytes": len(report)})

	result := fmt.Sprintf("Offline run %d of session %s finished: %d workspace entries, report in artifacts/report.md.\n",
		session.RunCount, c.SessionID, len(entries))
	if err := writeFileAtomic(c.resultPath(), []byte(result)); err != nil {
		return err
	}
	progress.say("done: run %d of session %s", session.RunCount, c.SessionID)
	tr.Event("result_written", map[string]any{"path": c.resultPath(), "run_count": session.RunCount})
	return progress.err
}

// progress prints paced progress lines to stdout and the trace.
type progress struct {
	ctx   context.Context
	out   io.Writer
	tr    *tracer
	step  time.Duration
	lines int
	err   error
}

func newProgress(ctx context.Context, out io.Writer, tr *tracer, step time.Duration) *progress {
	return &progress{ctx: ctx, out: out, tr: tr, step: step}
}

// say waits one step (except before the first line) and prints a line.
func (p *progress) say(format string, args ...any) {
	if p.lines > 0 && p.step > 0 {
		select {
		case <-p.ctx.Done():
		case <-time.After(p.step):
		}
	}
	p.lines++
	line := fmt.Sprintf(format, args...)
	if _, err := fmt.Fprintf(p.out, "[taskrun-agent] %s\n", line); err != nil && p.err == nil {
		p.err = fmt.Errorf("write progress: %w", err)
	}
	p.tr.Event("progress", map[string]any{"line": line})
}

// readOptional returns a file's content, or "" when it cannot be read.
func readOptional(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(data)
}

// listTree lists regular files and directories under root (relative, slash
// separated, directories with a trailing slash), skipping the agent's own state
// and stopping after limit entries. Symlinks are listed but never followed.
func listTree(root string, limit int) ([]string, error) {
	var entries []string
	errFull := errors.New("listing full")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == root {
			return nil
		}
		if d.IsDir() && d.Name() == ".taskrun-agent" {
			return filepath.SkipDir
		}
		if len(entries) >= limit {
			return errFull
		}
		rel, relErr := filepath.Rel(root, path)
		if relErr != nil {
			return relErr
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			rel += "/"
		}
		entries = append(entries, rel)
		return nil
	})
	if err != nil && !errors.Is(err, errFull) {
		return nil, fmt.Errorf("list workspace %s: %w", root, err)
	}
	return entries, nil
}

// offlineReport is the markdown report the offline routine delivers.
func offlineReport(c agentConfig, prompt string, entries []string, s sessionState) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Offline run report\n\n")
	fmt.Fprintf(&b, "- run: %s\n- task: %s\n- session: %s (run %d)\n\n", c.RunID, c.TaskID, c.SessionID, s.RunCount)
	fmt.Fprintf(&b, "## Prompt\n\n%s\n\n", quoteOrNone(prompt))
	fmt.Fprintf(&b, "## Workspace (%d entries)\n\n", len(entries))
	for _, e := range entries {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	fmt.Fprintf(&b, "\n## Session runs\n\n")
	for i, r := range s.Runs {
		fmt.Fprintf(&b, "%d. %s (%s, %s)\n", i+1, r.RunID, r.Mode, r.StartedAt.Format(time.RFC3339))
	}
	return b.String()
}

// quoteOrNone renders text as a markdown quote, or "(none)".
func quoteOrNone(text string) string {
	text = strings.TrimSpace(text)
	if text == "" {
		return "(none)"
	}
	return "> " + strings.ReplaceAll(text, "\n", "\n> ")
}
