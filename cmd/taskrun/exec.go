package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/moby/term"
	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
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
			)
			run.define(fs)
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
	list, err := cli.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", sandbox.LabelRun+"="+rec.RunID),
		filters.Arg("label", sandbox.LabelTenant+"="+rec.UserID),
		filters.Arg("status", "running"),
	)})
	if err != nil {
		return 0, err
	}
	id := ""
	switch {
	case len(list) == 1:
		id = list[0].ID
	case len(list) == 0 && rec.ContainerID != "":
		// A warm pool's container was labelled before its run claimed it:
		// the run's record names it.
		id = rec.ContainerID
	default:
		return 0, fmt.Errorf("run %s has %d running containers on this host: exec needs the host that runs it", rec.RunID, len(list))
	}
	info, err := cli.ContainerInspect(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("run %s has no running container on this host (exec needs the host that runs it): %w", rec.RunID, err)
	}
	if info.State == nil || !info.State.Running || info.Config == nil || info.Config.Labels[sandbox.LabelManaged] != "true" {
		return 0, fmt.Errorf("run %s has no running container on this host: exec needs the host that runs it", rec.RunID)
	}
	inFd, inTerm := term.GetFdInfo(stdinFile)
	outFd, outTerm := term.GetFdInfo(a.stdout)
	tty := inTerm && outTerm
	opts := container.ExecOptions{
		User:         info.Config.User, // the run's own uid:gid
		Privileged:   false,
		Tty:          tty,
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		WorkingDir:   model.ContainerHomeDir,
		Cmd:          cmd,
	}
	if tty {
		if ws, err := term.GetWinsize(outFd); err == nil {
			opts.ConsoleSize = &[2]uint{uint(ws.Height), uint(ws.Width)}
		}
	}
	created, err := cli.ContainerExecCreate(ctx, id, opts)
	if err != nil {
		return 0, err
	}
	hj, err := cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{Tty: tty, ConsoleSize: opts.ConsoleSize})
	if err != nil {
		return 0, err
	}
	defer hj.Close()
	if tty {
		state, err := term.SetRawTerminal(inFd)
		if err == nil {
			defer term.RestoreTerminal(inFd, state) //nolint:errcheck // best effort on the way out
		}
		stopResize := forwardResize(ctx, cli, created.ID, outFd)
		defer stopResize()
	}
	stdout, stderr := a.stdout, a.stderr
	var flushes []func() error
	if !raw {
		o, fo := a.terminalSafe(a.stdout)
		e, fe := a.terminalSafe(a.stderr)
		stdout, stderr, flushes = o, e, []func() error{fo, fe}
	}
	go func() {
		_, _ = io.Copy(hj.Conn, stdinFile)
		_ = hj.CloseWrite()
	}()
	if tty {
		_, err = io.Copy(stdout, hj.Reader)
	} else {
		_, err = stdcopy.StdCopy(stdout, stderr, hj.Reader)
	}
	for _, f := range flushes {
		_ = f()
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	res, err := cli.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		return 0, err
	}
	return res.ExitCode, nil
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
