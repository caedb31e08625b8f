package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"os/user"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/moby/term"
	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/termsafe"
)

const execHelp = `
Runs CMD inside the container of a run in progress on this host, as the run's
own user, with no added capability or privilege: the container's seccomp
profile, limits and no-new-privileges apply to it. With a terminal on stdin
and stdout, CMD gets a PTY (raw mode, resized with the window). Its output is
escaped for the terminal unless --raw. Who ran what, when, and its exit status
are added to the run's record (taskrun inspect). The exit status is CMD's.

A run on Kubernetes (taskrun run --backend kubernetes) is reached with
--namespace NS (and --kubeconfig): CMD runs in the run container of the
run's Pod, under the Pod's security context.

When a taskrun daemon answers (see taskrun run) and no --store or
--namespace is given, CMD runs through the daemon, in a run of yours in
progress there (root: any), with no stdin and no PTY; the daemon records it.
Another user's run is not found. --local runs it from this process, which
needs the engine's socket.
`

func init() {
	register(&command{
		Name:          "exec",
		Synopsis:      "run a command inside a live run's container, under the run's own policy",
		Args:          "RUN [--] CMD [ARGS...]",
		Help:          execHelp + runLookupHelp,
		StopAtCommand: true,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				run        storedRunFlags
				raw        bool
				kubeconfig string
				namespace  string
				via        daemonReadFlags
			)
			run.define(fs)
			via.define(fs)
			fs.BoolVar(&raw, "raw", false, "copy the command's output to the terminal verbatim")
			fs.StringVar(&namespace, "namespace", "", "for a run on Kubernetes: the namespace of its Pod")
			fs.StringVar(&kubeconfig, "kubeconfig", "", "with --namespace: the cluster's kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) > 1 && args[1] == "--" {
					args = append(args[:1:1], args[2:]...)
				}
				if len(args) < 2 {
					return a.usageError("exec", errors.New("name a run and a command: taskrun exec RUN -- CMD [ARGS...]"))
				}
				c, code := via.dial(ctx, a, "exec")
				if code != exitOK {
					return code
				}
				if c != nil {
					defer c.Close()
					return daemonExec(ctx, a, c, args[0], run.user, args[1:], raw)
				}
				st, rec, code := run.openRun(ctx, a, "exec", args[0])
				if st == nil {
					return code
				}
				defer st.Close()
				if rec.Status != model.StatusRunning {
					fmt.Fprintf(a.stderr, "taskrun exec: run %s is %s, not in progress: exec needs a live run\n", rec.RunID, rec.Status)
					return exitUsage
				}
				var exit int
				var err error
				if namespace != "" {
					exit, err = execInPod(ctx, a, rec, kubeconfig, namespace, args[1:], raw)
				} else {
					exit, err = execInRun(ctx, a, rec, args[1:], raw)
				}
				if err != nil {
					fmt.Fprintln(a.stderr, "taskrun exec:", termsafe.String(err.Error()))
					return exitCannotRun
				}
				if _, err := runindex.PutExec(ctx, st, rec, runindex.Exec{By: whoami(), At: time.Now().UTC(), Command: args[1:], Exit: exit}); err != nil {
					fmt.Fprintln(a.stderr, "taskrun exec:", err)
				}
				return exit
			}
		},
	})
}

// whoami names the person running taskrun on this host.
func whoami() string {
	if u, err := user.Current(); err == nil {
		return fmt.Sprintf("%s (uid %s)", u.Username, u.Uid)
	}
	return fmt.Sprintf("uid %d", os.Getuid())
}

// stdinFile is taskrun's stdin, replaced in tests.
var stdinFile io.Reader = os.Stdin

// execInRun runs cmd in rec's live container and returns its exit status.
func execInRun(ctx context.Context, a *app, rec *runindex.Record, cmd []string, raw bool) (int, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	id, user, err := docker.RunContainer(ctx, cli, rec.RunID, rec.UserID, rec.ContainerID)
	if err != nil {
		return 0, fmt.Errorf("%w: exec needs the host that runs it", err)
	}
	inFd, inTerm := term.GetFdInfo(stdinFile)
	outFd, outTerm := term.GetFdInfo(a.stdout)
	tty := inTerm && outTerm
	stopResize := func() {}
	defer func() { stopResize() }()
	opts := docker.ExecOptions{User: user, Tty: tty, Dir: model.ContainerHomeDir, Cmd: cmd, Stdin: stdinFile}
	if tty {
		if ws, err := term.GetWinsize(outFd); err == nil {
			opts.ConsoleSize = &[2]uint{uint(ws.Height), uint(ws.Width)}
		}
		state, err := term.SetRawTerminal(inFd)
		if err == nil {
			defer term.RestoreTerminal(inFd, state) //nolint:errcheck // best effort on the way out
		}
		opts.Started = func(execID string) { stopResize = forwardResize(ctx, cli, execID, outFd) }
	}
	opts.Stdout, opts.Stderr = a.stdout, a.stderr
	var flushes []func() error
	if !raw {
		o, fo := a.terminalSafe(a.stdout)
		e, fe := a.terminalSafe(a.stderr)
		opts.Stdout, opts.Stderr, flushes = o, e, []func() error{fo, fe}
	}
	exit, err := docker.Exec(ctx, cli, id, opts)
	for _, f := range flushes {
		_ = f()
	}
	return exit, err
}

// forwardResize keeps the exec's PTY the size of the terminal at fd.
func forwardResize(ctx context.Context, cli *client.Client, execID string, fd uintptr) (stop func()) {
	resize := func() {
		if ws, err := term.GetWinsize(fd); err == nil {
			_ = cli.ContainerExecResize(ctx, execID, container.ResizeOptions{Height: uint(ws.Height), Width: uint(ws.Width)})
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-sig:
				resize()
			case <-done:
				return
			}
		}
	}()
	resize()
	return func() { signal.Stop(sig); close(done) }
}

// daemonExec runs cmd in the caller's run in progress on the taskrun
// daemon and returns its exit status, as execInRun in this process.
func daemonExec(ctx context.Context, a *app, c *daemon.Client, runID, user string, cmd []string, raw bool) int {
	stdout, stderr := a.stdout, a.stderr
	if !raw {
		o, fo := a.terminalSafe(a.stdout)
		e, fe := a.terminalSafe(a.stderr)
		defer fo() //nolint:errcheck // best effort on the way out
		defer fe() //nolint:errcheck // best effort on the way out
		stdout, stderr = o, e
	}
	res, err := c.Exec(ctx, runID, daemon.ExecRequest{Argv: cmd}, stdout, stderr)
	var re *daemon.RefusedError
	if errors.As(err, &re) && re.Status == http.StatusNotFound {
		// Say why, as in this process: not a run of the caller's, or one
		// that is over.
		rec, rerr := c.Record(ctx, runID, user)
		if rerr != nil {
			return a.daemonError("exec", rerr)
		}
		if rec.Status != model.StatusRunning {
			fmt.Fprintf(a.stderr, "taskrun exec: run %s is %s, not in progress: exec needs a live run\n", rec.RunID, rec.Status)
			return exitUsage
		}
		fmt.Fprintf(a.stderr, "taskrun exec: %s: the taskrun daemon holds no run %s of yours in progress (a run started with --local: taskrun exec --local)\n", termsafe.String(err.Error()), termsafe.String(runID))
		return exitUsage
	}
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun exec:", termsafe.String(oneLine(err)))
		return exitCannotRun
	}
	if res.Error != "" {
		fmt.Fprintln(a.stderr, "taskrun exec:", termsafe.String(res.Error))
		return exitCannotRun
	}
	return res.Exit
}
