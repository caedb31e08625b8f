package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/termsafe"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workerclient"
)

// runOptions are the parsed flags of `taskrun run`.
type runOptions struct {
	runRefFlags
	serverFlags
	executorFlags
	workspace  string
	prompt     string
	resumeFrom string
	reap       bool
	keep       bool
	raw        bool
	jsonOut    bool
	egress     egress.Policy
	command    []string
	entrypoint string
	env        []string
	// changeExcludes are the --change-exclude patterns, added to
	// changeset.DefaultExcludes.
	changeExcludes []string

	// Raw --env and --env-file values, read by finish.
	envVars  []string
	envFiles []string

	// Raw flag values, checked by finish.
	allows      []string
	egressFile  string
	credentials []string

	// local forces the run into this process even when a daemon answers.
	local bool
	// detach starts a keep-alive run on the daemon and returns.
	detach bool
	// ports are the ports a live run's agent serves (--port, with --detach).
	ports []int
	// flags are the parsed flags, to tell which were given.
	flags *pflag.FlagSet
}

const runHelp = `
Runs one task in a fresh, hardened container: the workspace is copied into the
run's home, the agent (or CMD) runs with the run directory mounted at /taskrun,
and the output log, artifacts, session state, trace and isolation record go to
the store. Everything after the first argument that is not a flag is the
command to run instead of the image's default, flags included.

The run's stdout is copied live to stdout, its stderr to stderr. On a terminal,
control characters and escape sequences in them are shown as text (ESC as ^[);
--raw passes them through. The stored output log is always byte-exact.

When a taskrun daemon answers (see taskrun daemon) at $TASKRUN_HOST, else, as
a user other than root, at $XDG_RUNTIME_DIR/taskrun.sock and then at
/run/taskrun/taskrun.sock (as root: that one only), the run executes there and this command is its thin client: same output, exit status
and stored objects; the run's user is your tenant (your user name) unless you
are root; Ctrl-C cancels the run, a second Ctrl-C leaves it to the daemon.
--local, or any flag naming a machine of its own (--root, --store, --backend,
--helpers-dir, --uid-range, --runtime, --server, --credential, --model-*...),
runs it in this process, as does the absence of a daemon.

Exit status: the command's own, 124 on timeout, 125 when taskrun could not run
the container (bad input, no Docker engine, a missing, refused or unpullable
image), 130 on interrupt.
`

func init() {
	register(&command{
		Name:          "run",
		Synopsis:      "run one task in a sandbox",
		Args:          "[--] [CMD [ARGS...]]",
		Help:          runHelp,
		StopAtCommand: true,
		Flags: func(fs *pflag.FlagSet) action {
			o := &runOptions{flags: fs}
			o.define(fs)
			return func(ctx context.Context, a *app, args []string) int {
				if err := o.finish(args); err != nil {
					return a.usageError("run", err)
				}
				return runRun(ctx, a, *o)
			}
		},
	})
}

// define adds the flags of `taskrun run` to fs.
func (o *runOptions) define(fs *pflag.FlagSet) {
	o.runRefFlags.define(fs, "run ID (default: generated)")
	o.serverFlags.define(fs)
	o.executorFlags.define(fs, flagRole{})
	fs.StringVar(&o.workspace, "workspace", "", "host directory copied into the run's home")
	fs.StringVar(&o.prompt, "prompt", "", "the task's instruction to the agent")
	fs.StringVar(&o.entrypoint, "entrypoint", "", "program to run instead of the image's entrypoint, as docker run --entrypoint: CMD after it are its arguments, and the image's own command is dropped")
	fs.StringVar(&o.resumeFrom, "resume-from", "", "run ID whose session state this run resumes")
	fs.StringArrayVar(&o.changeExcludes, "change-exclude", nil, "glob pattern (relative to home, as --session-exclude) left out of the change set, so diff and apply never carry it; repeatable; always excluded: "+strings.Join(changeset.DefaultExcludes, ", ")+" (the reference agent's state)")
	fs.BoolVar(&o.keep, "keep", false, "keep the run directory on the host after a successful run")
	fs.BoolVar(&o.reap, "gc", true, "first recover runs whose executor is gone and remove leftover containers, as taskrun gc does (--gc=false skips it)")
	fs.BoolVar(&o.jsonOut, "json", false, "print one JSON result on stdout; the run's stdout goes to stderr")
	fs.BoolVar(&o.raw, "raw", false, "copy the run's output to the terminal verbatim, escape sequences included")
	fs.IntVar(&o.model.MaxTokens, "max-tokens", 0, "fail the run once it has used this many tokens (0: no cap)")
	fs.IntVar(&o.model.MaxRequests, "max-requests", 0, "fail the run once it has made this many model requests (0: no cap)")
	fs.StringArrayVar(&o.allows, "allow", nil, "let the run reach HOST[:PORT] through its egress proxy (no port: 80 and 443; *.suffix for every name below suffix; a loopback or private address only when its IP literal is allowed too, e.g. --allow api.test:8080 --allow 127.0.0.1:8080); repeatable")
	fs.StringVar(&o.egressFile, "egress-policy", "", "JSON egress policy file: rules, credentials, budgets (see docs/egress.md)")
	fs.StringArrayVar(&o.credentials, "credential", nil, `header the egress proxy adds for one host, its value read on the host: host=H,header=N,value-env=VAR|value-file=PATH[,format="Bearer %s"]; repeatable`)
	fs.StringArrayVar(&o.envVars, "env", nil, "set NAME=VALUE in the agent's environment (a bare NAME takes the host's value); repeatable; visible to the agent, so never a secret")
	fs.StringArrayVar(&o.envFiles, "env-file", nil, "read variables from a file in docker's --env-file format (NAME=VALUE lines, # comments); repeatable")
	fs.BoolVar(&o.local, "local", false, "run in this process even when a taskrun daemon answers (see taskrun daemon)")
	fs.BoolVar(&o.detach, "detach", false, "start a live run on the taskrun daemon and return: its container idles (or runs CMD) until taskrun stop RUN or the daemon's --max-idle, and takes commands through the daemon's process API (see docs/live-runs.md)")
	fs.IntSliceVar(&o.ports, "port", nil, "with --detach: a port the agent serves on 127.0.0.1 in its container, reached only through the daemon with its token (printed after the run ID); repeatable")
}

// finish checks the parsed flags and takes args as the command to run.
func (o *runOptions) finish(args []string) error {
	o.command = args
	if err := o.executorFlags.finish(flagRole{}); err != nil {
		return err
	}
	if o.backend == backendKubernetes && len(o.command) == 0 && o.entrypoint == "" && o.image == executor.DefaultImage {
		// A cluster's images cannot be inspected from here: name the
		// reference agent's command (its image's CMD) explicitly.
		o.command = []string{agentCommand}
	}
	var err error
	if o.egress, err = egress.BuildPolicy(o.egressFile, o.allows, o.credentials); err != nil {
		return err
	}
	env, err := readEnv(o.envFiles, o.envVars, os.LookupEnv)
	if err != nil {
		return err
	}
	o.env = env
	if o.runID == "" {
		o.runID = newRunID()
	}
	if len(o.ports) > 0 && !o.detach {
		return errors.New("--port declares a port of a live run: add --detach")
	}
	return o.serverFlags.check()
}

// parseRunFlags parses the arguments of `taskrun run`.
func parseRunFlags(args []string) (runOptions, error) {
	fs := newFlagSet("taskrun run", io.Discard)
	o := runOptions{flags: fs}
	fs.SetInterspersed(false)
	o.define(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	err := o.finish(fs.Args())
	return o, err
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
	case config.ProviderAnthropic:
		if name == "" {
			return errors.New("--model anthropic:NAME needs a model name, e.g. anthropic:claude-sonnet-4-5")
		}
		if m.APIKeyEnv == "" && m.APIKeyFile == "" {
			return errors.New("--model anthropic:NAME needs --model-api-key-env or --model-api-key-file")
		}
	default:
		return fmt.Errorf("--model %q: use scripted, scripted:FILE, openai:NAME or anthropic:NAME", spec)
	}
	m.Provider, m.Name = provider, name
	return nil
}

// helpersSelf is the --helpers-dir value naming the helpers installed with
// the taskrun binary (helpers.FromExecutable).
const helpersSelf = "self"

// readEnv reads the --env-file files in order, then the --env values, a
// later value of a name replacing an earlier one (as docker run does), and
// checks the result: no name taskrun sets itself.
func readEnv(files, vars []string, lookup func(string) (string, bool)) ([]string, error) {
	var env []string
	at := map[string]int{}
	add := func(kv string) {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := at[name]; ok {
			env[i] = kv
			return
		}
		at[name] = len(env)
		env = append(env, kv)
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("--env-file: %w", err)
		}
		vars, err := config.ParseEnvFile(f, lookup)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("--env-file %s: %w", name, err)
		}
		for _, kv := range vars {
			add(kv)
		}
	}
	for _, v := range vars {
		kv, ok, err := config.ParseEnvVar(v, lookup)
		if err != nil {
			return nil, fmt.Errorf("--env %q: %w", v, err)
		}
		if ok {
			add(kv)
		}
	}
	if err := config.CheckEnv(env); err != nil {
		return nil, fmt.Errorf("--env: %w", err)
	}
	return env, nil
}

// newRunID returns a sortable, unique run ID such as r20261129T230812-1a2b3c4d.
func newRunID() string {
	return "r" + time.Now().UTC().Format("20060102T150405") + "-" + strings.ToLower(rand.Text()[:8])
}

// runRun runs one task with the parsed options and presents its outcome.
func runRun(ctx context.Context, a *app, o runOptions) int {
	if shutdownBackstop != nil {
		stop := context.AfterFunc(ctx, func() { shutdownBackstop(o.shutdownGrace, a.stderr) })
		defer stop()
	}
	if o.detach {
		return runDetached(ctx, a, &o)
	}
	out, err := executeRun(ctx, a, &o)
	if errors.Is(err, daemon.ErrNoDaemon) {
		out, err = executeRunHere(ctx, a, o)
	}
	code := exitCode(out, err)
	switch {
	case o.jsonOut:
		writeJSONResult(a.stdout, o.runRefFlags, out, err)
	case a.quiet:
		if err != nil {
			fmt.Fprintf(a.stderr, "taskrun run: %s\n", termsafe.String(oneLine(err)))
		}
	default:
		writeSummary(a.stderr, o.runRefFlags, o.store, out, code)
		if err != nil && (out == nil || out.ContainerID == "") {
			fmt.Fprintf(a.stderr, "taskrun run: %s\n", termsafe.String(oneLine(err)))
		}
	}
	return code
}

// executeRun runs the task through the daemon when one answers and the
// flags name no machine of their own, else in this process: an error
// wrapping daemon.ErrNoDaemon says to run it here.
func executeRun(ctx context.Context, a *app, o *runOptions) (*executor.Outcome, error) {
	if err := o.checkRun(); err != nil {
		return nil, err
	}
	if o.local || o.machineFlag() != "" {
		return nil, daemon.ErrNoDaemon
	}
	return executeViaDaemon(ctx, a, o)
}

// checkRun refuses bad IDs and a missing workspace before connecting to
// anything.
func (o runOptions) checkRun() error {
	if err := o.runRefFlags.validate(); err != nil {
		return fmt.Errorf("%w: %w", errCannotRun, err)
	}
	if o.resumeFrom != "" {
		if err := model.ValidateID("--resume-from run", o.resumeFrom); err != nil {
			return fmt.Errorf("%w: %w", errCannotRun, err)
		}
	}
	if o.workspace != "" {
		if info, err := os.Stat(o.workspace); err != nil || !info.IsDir() {
			return fmt.Errorf("%w: --workspace %q is not a directory; pass an existing directory", errCannotRun, o.workspace)
		}
	}
	return nil
}

// executeRunHere builds the run's dependencies from the flags and runs it
// in this process.
func executeRunHere(ctx context.Context, a *app, o runOptions) (*executor.Outcome, error) {
	// Refuse bad IDs before connecting to anything.
	if err := o.runRefFlags.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", errCannotRun, err)
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
	// The run's timings count from here: setting up and the start's gc are
	// part of what a cold run costs.
	rec := timings.New(nil)
	stopSetup := rec.Start(timings.Setup)
	ho := hostOptions{
		token: o.token,
		// The run winds down a little before the backstop ends the process.
		shutdownGrace: o.shutdownGrace - min(o.shutdownGrace/5, 5*time.Second),
	}
	if o.server != "" {
		ho.controlPlane = &journal.ControlPlane{URL: journal.RedactURL(o.server)}
		if o.tokenFromEnv {
			ho.controlPlane.TokenEnv = envToken
		}
	}
	if f, ok := a.stderr.(*os.File); ok && !a.quiet {
		// Pulls show docker's progress bars on a terminal, else a summary
		// on the log.
		ho.dockerOpts = append(ho.dockerOpts, docker.WithPullProgress(f, f.Fd(), a.isTerminal(f)))
	}
	host, err := o.openHost(ctx, a, ho)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	defer host.close()
	stopSetup()
	if o.reap {
		stopGC := rec.Start(timings.GC)
		host.Recover(ctx)
		stopGC()
	}

	// The live copies of the run's output are the agent's bytes: on a
	// terminal they are escaped (unless --raw). The stored log and the
	// stream to the control plane are fed from the spool, untouched.
	runStdout := a.stdout
	if o.jsonOut {
		runStdout = a.stderr
	}
	liveOut, flushOut := a.live(runStdout, o.raw)
	liveErr, flushErr := a.live(a.stderr, o.raw)
	defer flushErr()
	defer flushOut()

	spec := executor.Spec{
		Task: &model.Task{
			ID: o.task, UserID: o.user, ConversationID: o.conversation,
			Prompt: o.prompt, WorkspaceDir: o.workspace,
		},
		Run:            &model.TaskRun{ID: o.runID, TaskID: o.task, PreviousRunID: o.resumeFrom, Status: model.StatusRunning},
		SessionID:      o.session,
		Model:          o.model,
		Egress:         o.egress,
		Command:        o.command,
		Entrypoint:     entrypoint(o.entrypoint),
		Env:            o.env,
		KeepRunDir:     o.keep,
		ChangeExcludes: changeExcludes(o.changeExcludes),
		Stderr:         liveErr,
		Timings:        rec,
	}
	if o.server != "" {
		client := workerclient.New(o.server, o.token)
		spec.Updater = client
		spec.StreamSender = client.Stream()
		spec.Stdout = liveOut
	} else {
		spec.Updater = executor.LogUpdater{Log: a.log}
		spec.StreamSender = workerclient.NewWriterStreamSender(liveOut)
	}
	out, err := host.Run(ctx, spec)
	if err != nil && out != nil && out.ContainerID == "" && out.Status == model.StatusFailed {
		// Nothing ran: the container could not be started.
		return out, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	return out, err
}

// live returns the writer for a live copy of the run's output to w: escaped
// for the terminal when w is one and raw is not set. flush writes out what the
// escaper holds back (an incomplete character) once the run is over.
func (a *app) live(w io.Writer, raw bool) (live io.Writer, flush func()) {
	if raw || !a.isTerminal(w) {
		return w, func() {}
	}
	t := termsafe.NewWriter(w)
	return t, func() { _ = t.Flush() }
}

// errCannotRun marks errors that kept the container from running (exit 125).
var errCannotRun = errors.New("could not run")

// exitCode maps an outcome to the process exit status, as `docker run` does.
func exitCode(out *executor.Outcome, err error) int {
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
	RunID     string          `json:"run_id"`
	Status    model.RunStatus `json:"status"`
	ExitCode  int             `json:"exit_code"`
	OOMKilled bool            `json:"oom_killed"`
	TimedOut  bool            `json:"timed_out"`
	Reason    string          `json:"reason,omitempty"`
	Error     string          `json:"error,omitempty"`
	// Image is the image asked for; ImageDigest the one the run used (its
	// repo digest when it came from a registry, else its image ID).
	Image       string         `json:"image,omitempty"`
	ImageDigest string         `json:"image_digest,omitempty"`
	Result      *jsonRunResult `json:"result"`
	// Stored is every object the run stored, with its key in the store.
	Stored []persist.ObjectInfo `json:"stored"`
	// TraceKey is the trace's key in the store; empty without a trace.
	TraceKey string `json:"trace_key,omitempty"`
	// Changes names the stored change set and counts it; absent when the
	// run has none.
	Changes *workerclient.ChangeSet `json:"changes,omitempty"`
	// Skipped lists the agent's files that were not stored, with why.
	Skipped []executor.SkippedFile `json:"skipped,omitempty"`
	// Usage is what the run's container used (CPU time, peak memory,
	// block I/O, peak pids); absent when its backend samples none.
	Usage *sandbox.Usage `json:"usage,omitempty"`
	// Timings are the run's phases, each with its start (from the
	// command's start) and duration in milliseconds.
	Timings []timings.Span `json:"timings,omitempty"`
}

// jsonRunResult is the library's RunResult, except that the artifacts
// directory is named only while it exists (it is removed once persisted).
type jsonRunResult struct {
	executor.RunResult
	RunArtifactsDir string `json:"run_artifacts_dir,omitempty"`
}

func writeJSONResult(w io.Writer, ref runRefFlags, out *executor.Outcome, err error) {
	res := jsonResult{RunID: ref.runID, Status: model.StatusFailed, ExitCode: exitCode(out, err), Stored: []persist.ObjectInfo{}}
	if out != nil {
		res.Status = out.Status
		res.Reason = out.Reason
		res.Image, res.ImageDigest = out.Image, out.ImageDigest
		res.OOMKilled = out.Exit.OOMKilled
		res.TimedOut = out.Exit.TimedOut
		res.Result = &jsonRunResult{RunResult: out.Result}
		if dirExists(out.Result.RunArtifactsDir) {
			res.Result.RunArtifactsDir = out.Result.RunArtifactsDir
		}
		if out.Stored != nil {
			res.Stored = out.Stored
		}
		res.TraceKey = traceKey(out, ref.user)
		res.Changes = out.Changes
		res.Skipped = out.Skipped
		res.Usage = out.Usage
		res.Timings = out.Timings
	}
	if err != nil {
		res.Error = oneLine(err)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(res)
}

func dirExists(dir string) bool {
	if dir == "" {
		return false
	}
	info, err := os.Stat(dir)
	return err == nil && info.IsDir()
}

// oneLine flattens a joined error into one line for the terminal.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

// defaultShutdownGrace is the default of --shutdown-grace.
const defaultShutdownGrace = 30 * time.Second

// shutdownBackstop, set by main, ends the process grace after a signal if
// the run has not finished by then; the journal keeps what is left.
var shutdownBackstop func(grace time.Duration, stderr io.Writer)

// entrypoint is the --entrypoint flag as RunTaskInput.Entrypoint: none when
// empty.
func entrypoint(flag string) []string {
	if flag == "" {
		return nil
	}
	return []string{flag}
}

// changeExcludes is --change-exclude as RunTaskInput.ChangeExcludes: the
// default excludes and the given patterns.
func changeExcludes(given []string) []string {
	if len(given) == 0 {
		return nil
	}
	return append(slices.Clone(changeset.DefaultExcludes), given...)
}
