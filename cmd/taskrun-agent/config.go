package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/taskrun/taskrun/model"
)

// errBadConfig marks invalid flags or environment.
var errBadConfig = errors.New("invalid agent configuration")

// agentConfig is everything the agent reads from its flags and environment.
type agentConfig struct {
	Home        string
	Artifacts   string
	Global      string
	Output      string
	AgentsMD    string
	PromptFile  string
	RunID       string
	TaskID      string
	SessionID   string
	ModelSocket string
	Model       string
	// Step is the pause between the offline routine's progress lines.
	Step time.Duration
	// MaxTurns bounds the model loop.
	MaxTurns int
	// CommandTimeout bounds one run_command tool call.
	CommandTimeout time.Duration
	// Shell is the shell run_command uses; empty disables the tool.
	Shell string
}

// stateDir is the agent's own directory inside home.
func (c agentConfig) stateDir() string { return filepath.Join(c.Home, ".taskrun-agent") }

// tracePath is where this run's JSONL trace goes.
func (c agentConfig) tracePath() string {
	return filepath.Join(c.Global, "traces", c.SessionID, "rt_"+c.RunID+".jsonl")
}

// resultPath is the final answer file.
func (c agentConfig) resultPath() string { return filepath.Join(c.Output, "result.md") }

// parseConfig reads flags (args without the program name) over the environment
// read through getenv. Flags win over environment variables.
func parseConfig(args []string, getenv func(string) string) (agentConfig, error) {
	envOr := func(key, def string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("taskrun-agent", flag.ContinueOnError)
	root := fs.String("root", envOr("TASKRUN_ROOT", "/taskrun"), "run directory as mounted in the container")
	var c agentConfig
	fs.StringVar(&c.Home, "home", "", "workspace and HOME (default ROOT/home)")
	fs.StringVar(&c.Artifacts, "artifacts", "", "artifacts directory (default ROOT/artifacts)")
	fs.StringVar(&c.Global, "global", "", "run-global directory (default ROOT/global)")
	fs.StringVar(&c.Output, "output", "", "output directory (default ROOT/output)")
	fs.StringVar(&c.AgentsMD, "agents-md", "", "AGENTS.md path (default ROOT/AGENTS.md)")
	fs.StringVar(&c.PromptFile, "prompt-file", getenv("TASKRUN_PROMPT_FILE"), "prompt file (default ROOT/prompt.txt)")
	fs.StringVar(&c.RunID, "run-id", getenv("TASKRUN_RUN_ID"), "run ID")
	fs.StringVar(&c.TaskID, "task-id", getenv("TASKRUN_TASK_ID"), "task ID")
	fs.StringVar(&c.SessionID, "session-id", getenv("TASKRUN_SESSION_ID"), "session ID (default: the run ID)")
	fs.StringVar(&c.ModelSocket, "model-socket", getenv("TASKRUN_MODEL_SOCKET"), "model gateway unix socket; empty runs the offline routine")
	fs.StringVar(&c.Model, "model", getenv("TASKRUN_MODEL"), "model name sent to the gateway")
	fs.DurationVar(&c.Step, "step", 500*time.Millisecond, "pause between offline progress lines")
	fs.IntVar(&c.MaxTurns, "max-turns", 40, "maximum model turns in one run")
	fs.DurationVar(&c.CommandTimeout, "command-timeout", 30*time.Second, "timeout of one run_command call")
	fs.StringVar(&c.Shell, "shell", "/bin/sh", "shell for run_command; the tool is offered only if it is executable")
	if err := fs.Parse(args); err != nil {
		return agentConfig{}, fmt.Errorf("%w: %w", errBadConfig, err)
	}
	defaults := []struct {
		dst  *string
		name string
	}{
		{&c.Home, "home"}, {&c.Artifacts, "artifacts"}, {&c.Global, "global"},
		{&c.Output, "output"}, {&c.AgentsMD, "AGENTS.md"}, {&c.PromptFile, "prompt.txt"},
	}
	for _, d := range defaults {
		if *d.dst == "" {
			*d.dst = filepath.Join(*root, d.name)
		}
	}
	if c.SessionID == "" {
		c.SessionID = c.RunID
	}
	return c, c.validate()
}

// validate checks the IDs that become path components.
func (c agentConfig) validate() error {
	ids := []struct{ name, flag, value string }{
		{"run", "-run-id or TASKRUN_RUN_ID", c.RunID},
		{"session", "-session-id or TASKRUN_SESSION_ID", c.SessionID},
	}
	if c.TaskID != "" {
		ids = append(ids, struct{ name, flag, value string }{"task", "-task-id or TASKRUN_TASK_ID", c.TaskID})
	}
	for _, id := range ids {
		if err := model.ValidateID(id.name, id.value); err != nil {
			return fmt.Errorf("%w: %w; set %s", errBadConfig, err, id.flag)
		}
	}
	return nil
}
