package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/docker/go-units"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workspace"
)

// runOptions are the parsed flags of `taskrun run`.
type runOptions struct {
	workspace  string
	prompt     string
	image      string
	store      string
	root       string
	user       string
	task       string
	session    string
	resumeFrom string
	runID      string
	timeout    time.Duration
	disk       int64
	maxOutput  int64
	helpersDir string
	reap       bool
	keep       bool
	policy     sandbox.Policy
	jsonOut    bool
	server     string
	token      string
	model      config.ModelEntry
	excludes   stringList
	egress     egress.Policy
	command    []string
}

// parseRunFlags parses `taskrun run` arguments; everything after `--` is the
// command to run instead of the image's default.
func parseRunFlags(args []string, stderr io.Writer) (runOptions, error) {
	o := runOptions{policy: sandbox.DefaultPolicy()}
	fs := flag.NewFlagSet("taskrun run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.workspace, "workspace", "", "host directory copied into the run's home")
	fs.StringVar(&o.prompt, "prompt", "", "the task's instruction to the agent")
	fs.StringVar(&o.image, "image", taskrun.DefaultImage, "run image (must exist locally; see `taskrun images build`)")
	fs.StringVar(&o.store, "store", "file://./.taskrun/store", "blob store URL: file://, s3://, gs://, azblob://, mem://")
	fs.StringVar(&o.root, "root", "./.taskrun/runtime", "host directory holding run directories")
	fs.StringVar(&o.user, "user", "local", "user (tenant) ID")
	fs.StringVar(&o.task, "task", "default", "task ID")
	fs.StringVar(&o.session, "session", "default", "agent session ID")
	fs.StringVar(&o.resumeFrom, "resume-from", "", "run ID whose session state this run resumes")
	fs.StringVar(&o.runID, "run-id", "", "run ID (default: generated)")
	fs.DurationVar(&o.timeout, "timeout", taskrun.DefaultTimeout, "stop the run after this long")
	memory := fs.String("memory", units.BytesSize(float64(o.policy.MemoryBytes)), "memory limit, e.g. 512m or 2g (no swap)")
	cpus := fs.Float64("cpus", float64(o.policy.NanoCPUs)/1e9, "CPU limit")
	fs.Int64Var(&o.policy.PidsLimit, "pids", o.policy.PidsLimit, "process limit")
	maxOutput := fs.String("max-output", units.BytesSize(taskrun.DefaultMaxOutputBytes), "cap on the stdout (and the stderr) kept from the run; the rest is dropped")
	disk := fs.String("disk", units.BytesSize(taskrun.DefaultDiskLimitBytes), "cap on what the run may store under /taskrun")
	fs.StringVar(&o.helpersDir, "helpers-dir", executableDir(), "directory of the static in-sandbox helpers (taskrun-probe); empty disables the self-check")
	fs.StringVar(&o.policy.Runtime, "runtime", "", "OCI runtime, e.g. runsc for gVisor")
	fs.Var(&o.excludes, "session-exclude", "glob pattern (relative to home) left out of the session state; repeatable (default: "+strings.Join(workspace.DefaultExcludes, ", ")+")")
	fs.BoolVar(&o.keep, "keep", false, "keep the run directory on the host after a successful run")
	fs.BoolVar(&o.reap, "gc", true, "first remove leftover containers that no live run owns (as `taskrun gc`)")
	fs.BoolVar(&o.jsonOut, "json", false, "print one JSON result on stdout; the run's stdout goes to stderr")
	fs.StringVar(&o.server, "server", "", "control plane base URL; without it, status and output go to the terminal")
	fs.StringVar(&o.token, "token", "", "bearer token for --server")
	modelSpec := fs.String("model", "", "model for the agent: scripted (the built-in demo script), scripted:FILE or openai:NAME; empty runs the agent offline")
	fs.StringVar(&o.model.BaseURL, "model-base-url", "", "upstream API root for openai:NAME, e.g. https://api.openai.com/v1")
	fs.StringVar(&o.model.APIKeyEnv, "model-api-key-env", "", "host environment variable holding the API key (it never enters the sandbox)")
	fs.StringVar(&o.model.APIKeyFile, "model-api-key-file", "", "host file holding the API key (it never enters the sandbox)")
	fs.IntVar(&o.model.MaxTokens, "max-tokens", 0, "fail the run once it has used this many tokens (0: no cap)")
	fs.IntVar(&o.model.MaxRequests, "max-requests", 0, "fail the run once it has made this many model requests (0: no cap)")
	var allows, credentials stringList
	fs.Var(&allows, "allow", "let the run reach HOST[:PORT] (no port: 80 and 443; *.suffix for every name below suffix) through its egress proxy; repeatable")
	policyFile := fs.String("egress-policy", "", "JSON egress policy file: rules, credentials, budgets (see docs/egress.md)")
	fs.Var(&credentials, "credential", `header the egress proxy adds for one host, read on the host: host=H,header=N,value-env=VAR|value-file=PATH[,format="Bearer %s"]; repeatable`)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := parseModel(*modelSpec, &o.model); err != nil {
		return o, err
	}
	var err error
	if o.egress, err = egress.BuildPolicy(*policyFile, allows, credentials); err != nil {
		return o, err
	}
	o.command = fs.Args()
	if len(o.command) > 0 && !hasDoubleDash(args) {
		return o, fmt.Errorf("unexpected argument %q; put the command after `--`", o.command[0])
	}
	mem, err := units.RAMInBytes(*memory)
	if err != nil || mem <= 0 {
		return o, fmt.Errorf("--memory %q: give a size such as 512m or 2g", *memory)
	}
	o.policy.MemoryBytes = mem
	if o.maxOutput, err = units.RAMInBytes(*maxOutput); err != nil || o.maxOutput <= 0 {
		return o, fmt.Errorf("--max-output %q: give a size such as 1g", *maxOutput)
	}
	if o.disk, err = units.RAMInBytes(*disk); err != nil || o.disk <= 0 {
		return o, fmt.Errorf("--disk %q: give a size such as 2g", *disk)
	}
	if *cpus <= 0 {
		return o, fmt.Errorf("--cpus %v: give a positive number such as 1 or 0.5", *cpus)
	}
	o.policy.NanoCPUs = int64(*cpus * 1e9)
	if o.timeout <= 0 {
		return o, fmt.Errorf("--timeout %v: give a positive duration such as 10m", o.timeout)
	}
	if o.runID == "" {
		o.runID = newRunID()
	}
	if o.server == "" && o.token != "" {
		return o, errors.New("--token needs --server")
	}
	return o, nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// parseModel fills m's provider and name from a --model value.
func parseModel(spec string, m *config.ModelEntry) error {
	provider, name, _ := strings.Cut(spec, ":")
	switch provider {
	case "":
		if m.BaseURL != "" || m.APIKeyEnv != "" || m.APIKeyFile != "" {
			return errors.New("--model-* flags need --model")
		}
		return nil
	case config.ProviderScripted:
		if name == "" {
			name = gateway.DemoScriptName
		}
	case config.ProviderOpenAI:
		if name == "" || m.BaseURL == "" {
			return errors.New("--model openai:NAME needs a model name and --model-base-url")
		}
		if m.APIKeyEnv == "" && m.APIKeyFile == "" {
			return errors.New("--model openai:NAME needs --model-api-key-env or --model-api-key-file")
		}
	default:
		return fmt.Errorf("--model %q: use scripted, scripted:FILE or openai:NAME", spec)
	}
	m.Provider, m.Name = provider, name
	return nil
}

func hasDoubleDash(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return true
		}
	}
	return false
}

// newRunID returns a sortable, unique run ID such as r20261129T230812-1a2b3c4d.
func newRunID() string {
	return "r" + time.Now().UTC().Format("20060102T150405") + "-" + strings.ToLower(rand.Text()[:8])
}

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseRunFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "taskrun run:", err)
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	out, err := executeRun(ctx, o, stdout, stderr, log)
	if o.jsonOut {
		writeJSONResult(stdout, o.runID, out, err)
	} else {
		writeSummary(stderr, o.runID, o.store, out)
		if err != nil && (out == nil || out.ContainerID == "") {
			fmt.Fprintln(stderr, "taskrun run:", oneLine(err))
		}
	}
	return exitCode(out, err)
}

// executeRun builds the run's dependencies from the flags and runs it.
func executeRun(ctx context.Context, o runOptions, stdout, stderr io.Writer, log *slog.Logger) (*taskrun.Outcome, error) {
	// Refuse bad IDs before connecting to anything.
	for _, id := range []struct{ kind, v string }{{"--user user", o.user}, {"--task task", o.task}, {"--session session", o.session}, {"--run-id run", o.runID}} {
		if err := model.ValidateID(id.kind, id.v); err != nil {
			return nil, fmt.Errorf("%w: %w", errCannotRun, err)
		}
	}
	if o.resumeFrom != "" {
		if err := model.ValidateID("--resume-from run", o.resumeFrom); err != nil {
			return nil, fmt.Errorf("%w: %w", errCannotRun, err)
		}
	}
	if o.workspace != "" {
		if info, err := os.Stat(o.workspace); err != nil || !info.IsDir() {
			return nil, fmt.Errorf("%w: --workspace %q is not a directory; pass an existing directory", errCannotRun, o.workspace)
		}
	}
	root, err := filepath.Abs(o.root)
	if err != nil {
		return nil, fmt.Errorf("%w: --root: %w", errCannotRun, err)
	}
	if o.helpersDir != "" {
		if o.helpersDir, err = filepath.Abs(o.helpersDir); err != nil {
			return nil, fmt.Errorf("%w: --helpers-dir: %w", errCannotRun, err)
		}
	}
	store, err := persist.Open(ctx, o.store)
	if err != nil {
		return nil, fmt.Errorf("%w: --store: %w", errCannotRun, err)
	}
	defer store.Close()
	backend, err := docker.New(ctx, docker.WithLogger(log))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	defer backend.Close()
	if o.reap {
		if rep, err := backend.Reap(ctx, docker.ReapOptions{}); err != nil {
			log.Warn("reap leftover containers", "err", err)
		} else if len(rep.Removed) > 0 {
			log.Info("removed leftover containers", "count", len(rep.Removed))
		}
	}

	runStdout := stdout
	if o.jsonOut {
		runStdout = stderr
	}
	in := taskrun.RunTaskInput{
		Task: &model.Task{
			ID: o.task, UserID: o.user, ConversationID: cliConversation,
			Prompt: o.prompt, WorkspaceDir: o.workspace,
		},
		Run:             &model.TaskRun{ID: o.runID, TaskID: o.task, PreviousRunID: o.resumeFrom, Status: model.StatusRunning},
		SessionID:       o.session,
		Paths:           taskrun.NewRuntimePathsFromRoot(root),
		Persist:         store,
		ArtifactStorage: store,
		Model:           o.model,
		Egress:          o.egress,
		Sandbox:         backend,
		Image:           o.image,
		Command:         o.command,
		Policy:          o.policy,
		Timeout:         o.timeout,
		DiskLimitBytes:  o.disk,
		KeepRunDir:      o.keep,
		SessionExcludes: o.excludes,
		MaxOutputBytes:  o.maxOutput,
		HelpersDir:      o.helpersDir,
		Stderr:          stderr,
		Logger:          log,
	}
	if o.server != "" {
		client := workerclient.New(o.server, o.token)
		in.Updater = client
		in.StreamSender = client.Stream()
		in.Stdout = runStdout
	} else {
		in.Updater = logUpdater{log: log}
		in.StreamSender = workerclient.NewWriterStreamSender(runStdout)
	}
	out, err := taskrun.Execute(ctx, in)
	if err != nil && out != nil && out.ContainerID == "" && out.Status == model.StatusFailed {
		// Nothing ran: the container could not be started.
		return out, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	return out, err
}

// cliConversation is the conversation every CLI run belongs to.
const cliConversation = "cli"

// errCannotRun marks errors that kept the container from running (exit 125).
var errCannotRun = errors.New("could not run")

// exitCode maps an outcome to the process exit status, as `docker run` does.
func exitCode(out *taskrun.Outcome, err error) int {
	switch {
	case errors.Is(err, errCannotRun) || out == nil:
		if err == nil {
			return exitOK
		}
		return exitCannotRun
	case out.Exit.TimedOut:
		return exitTimeout
	case out.Status == model.StatusCancelled:
		return exitInterrupted
	case out.Exit.ExitCode > 0:
		return out.Exit.ExitCode
	case err != nil:
		return exitFailure
	}
	return exitOK
}

// jsonResult is the object `taskrun run --json` prints.
type jsonResult struct {
	RunID     string             `json:"run_id"`
	Status    model.RunStatus    `json:"status"`
	ExitCode  int                `json:"exit_code"`
	OOMKilled bool               `json:"oom_killed"`
	TimedOut  bool               `json:"timed_out"`
	Error     string             `json:"error,omitempty"`
	Result    *taskrun.RunResult `json:"result"`
}

func writeJSONResult(w io.Writer, runID string, out *taskrun.Outcome, err error) {
	res := jsonResult{RunID: runID, Status: model.StatusFailed, ExitCode: exitCode(out, err)}
	if out != nil {
		res.Status = out.Status
		res.OOMKilled = out.Exit.OOMKilled
		res.TimedOut = out.Exit.TimedOut
		res.Result = &out.Result
	}
	if err != nil {
		res.Error = oneLine(err)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(res)
}

// oneLine flattens a joined error into one line for the terminal.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
