package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"golang.org/x/sys/unix"

	"github.com/taskrun/taskrun/sandbox"
)

// ErrNoRunContainer is a run with no running container on this host.
var ErrNoRunContainer = errors.New("no running container on this host")

// RunContainer finds the running container of run runID, tenant's, on the
// engine of cli: the one so labelled, else recordedID (a warm pool's
// container, labelled before its run claimed it; empty: none). It returns
// the container's ID and its user (the run's own uid:gid).
func RunContainer(ctx context.Context, cli client.APIClient, runID, tenant, recordedID string) (id, user string, err error) {
	list, err := cli.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", sandbox.LabelRun+"="+runID),
		filters.Arg("label", sandbox.LabelTenant+"="+tenant),
		filters.Arg("status", "running"),
	)})
	if err != nil {
		return "", "", err
	}
	switch {
	case len(list) == 1:
		id = list[0].ID
	case len(list) == 0 && recordedID != "":
		id = recordedID
	case len(list) == 0:
		return "", "", fmt.Errorf("run %s: %w", runID, ErrNoRunContainer)
	default:
		return "", "", fmt.Errorf("run %s has %d running containers on this host", runID, len(list))
	}
	info, err := cli.ContainerInspect(ctx, id)
	if err != nil {
		return "", "", fmt.Errorf("run %s: %w: %w", runID, ErrNoRunContainer, err)
	}
	if info.State == nil || !info.State.Running || info.Config == nil || info.Config.Labels[sandbox.LabelManaged] != "true" {
		return "", "", fmt.Errorf("run %s: %w", runID, ErrNoRunContainer)
	}
	return id, info.Config.User, nil
}

// ExecOptions is a command to run in a run's container.
type ExecOptions struct {
	// User is the run's own uid:gid (RunContainer's user).
	User string
	// Cmd is the argv; Env adds KEY=VALUE entries; Dir is the working
	// directory (the container's default when empty).
	Cmd []string
	Env []string
	Dir string
	// Tty gives the command a PTY of ConsoleSize (height, width).
	Tty         bool
	ConsoleSize *[2]uint
	// Stdin is copied to the command (nil: none); Stdout and Stderr get
	// its output (with Tty, all of it goes to Stdout).
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Started, when set, is called with the exec's ID once it is attached.
	Started func(execID string)
}

// Exec runs o.Cmd in container id as o.User, with no added capability or
// privilege: the container's seccomp profile, limits and
// no-new-privileges apply to it. It returns the command's exit status.
func Exec(ctx context.Context, cli client.APIClient, id string, o ExecOptions) (int, error) {
	opts := container.ExecOptions{
		User:         o.User,
		Privileged:   false,
		Tty:          o.Tty,
		AttachStdin:  o.Stdin != nil,
		AttachStdout: true,
		AttachStderr: true,
		WorkingDir:   o.Dir,
		Env:          o.Env,
		Cmd:          o.Cmd,
		ConsoleSize:  o.ConsoleSize,
	}
	created, err := cli.ContainerExecCreate(ctx, id, opts)
	if err != nil {
		return 0, err
	}
	hj, err := cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{Tty: o.Tty, ConsoleSize: o.ConsoleSize})
	if err != nil {
		return 0, err
	}
	defer hj.Close()
	if o.Started != nil {
		o.Started(created.ID)
	}
	if o.Stdin != nil {
		go func() {
			_, _ = io.Copy(hj.Conn, o.Stdin)
			_ = hj.CloseWrite()
		}()
	}
	stop := context.AfterFunc(ctx, func() { hj.Close() })
	defer stop()
	if o.Tty {
		_, err = io.Copy(o.Stdout, hj.Reader)
	} else {
		_, err = stdcopy.StdCopy(o.Stdout, o.Stderr, hj.Reader)
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
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

// ErrExecNotRunning is a signal to a command that has already ended.
var ErrExecNotRunning = errors.New("the command is not running")

// SignalExec sends sig to the process of exec execID, a command started
// by Exec in container id, and to nothing else: the exec must belong to
// that container and still run. The process is pinned with a pidfd
// between two looks at the exec, so a pid the kernel reused after the

// execStartWait bounds how long SignalExec waits for a command whose start
// was asked for to run: the engine starts the process after it answered
// the attach.
const execStartWait = 5 * time.Second

// startedExec inspects the command execID once the engine has started it (a
// pid, running or ended), waiting at most execStartWait for that.
func startedExec(ctx context.Context, cli client.APIClient, execID string) (container.ExecInspect, error) {
	ctx, cancel := context.WithTimeout(ctx, execStartWait)
	defer cancel()
	for {
		info, err := cli.ContainerExecInspect(ctx, execID)
		if err != nil || info.Running || info.Pid > 0 {
			return info, err
		}
		select {
		case <-ctx.Done():
			return info, nil // never started: refused as not running
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// command ended is never signalled.
func SignalExec(ctx context.Context, cli client.APIClient, id, execID string, sig syscall.Signal) error {
	before, err := startedExec(ctx, cli, execID)
	if err != nil {
		return fmt.Errorf("signal command %s: %w", execID, err)
	}
	if before.ContainerID != id {
		return fmt.Errorf("signal command %s: it is not of container %s", execID, id)
	}
	if !before.Running || before.Pid <= 0 {
		return fmt.Errorf("signal command %s: %w", execID, ErrExecNotRunning)
	}
	fd, err := unix.PidfdOpen(before.Pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal command %s: %w", execID, ErrExecNotRunning)
	}
	if err != nil {
		return fmt.Errorf("signal command %s: pidfd: %w", execID, err)
	}
	defer unix.Close(fd)
	after, err := cli.ContainerExecInspect(ctx, execID)
	if err != nil {
		return fmt.Errorf("signal command %s: %w", execID, err)
	}
	if !after.Running || after.Pid != before.Pid {
		return fmt.Errorf("signal command %s: %w", execID, ErrExecNotRunning)
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal command %s: %w", execID, ErrExecNotRunning)
		}
		return fmt.Errorf("signal command %s: %w", execID, err)
	}
	return nil
}
