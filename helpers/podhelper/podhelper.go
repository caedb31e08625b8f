// Package podhelper is the executor's helper inside a run's Pod on
// Kubernetes: the part of sandbox/kubernetes that runs on the node.
//
// It is one small static program with subcommands, cmd/taskrun-pod, which
// the helper image taskrun/podhelper:local holds (the taskrun binary also
// acts as it when run under that name):
//
//   - fill DATA BIN, the Pod's init container: copies itself to BIN, where
//     the run container finds it, and extracts the run's mounts from a fill
//     stream (stream.go) read on stdin into the data volume DATA.
//   - gate [--ack-idle D] [--termination-log PATH] -- CMD..., the run
//     container's first process: it
//     waits for one byte on stdin, which the executor sends only once it is
//     attached to the container's output, so not a byte of output is lost;
//     then it runs CMD as its child with stdin on /dev/null, forwards its
//     stdout and stderr, forwards signals to it, reaps orphans, and exits
//     with CMD's status (128+signal when killed), as an init process does
//     for Docker's --init, but only once the executor acknowledged every
//     byte of that output (ack.go), or D passed without progress; its
//     termination message (PATH) then says whether output may be lost.
//   - stop GRACE, exec'd in the run container to stop it: SIGTERM to the gate
//     (which forwards it), and after GRACE SIGKILL to every process.
//   - hold, the keeper container: it keeps the Pod, and so the data volume,
//     alive after the run container exited until the executor copied the
//     outputs out and deleted the Pod.
//   - pack DIR, exec'd in the keeper: writes DIR as a PackHome archive to
//     stdout.
//   - hold --control CONTROL SOCKET... and tunnel CONTROL SOCKET: the model
//     tunnel (tunnel.go).
package podhelper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/taskrun/taskrun/workspace"
)

// Names and paths of the helper.
const (
	// Name is the helper's program name; the taskrun binary acts as the
	// helper when run under it.
	Name = "taskrun-pod"
	// ImagePath is where the helper image holds the program.
	ImagePath = "/" + Name
	// BinDir is where the bin volume (the helper, copied there by fill) is
	// mounted in every container of the Pod.
	BinDir = "/.taskrun-pod/bin"
	// Path is the helper's path in the run container.
	Path = BinDir + "/" + Name
	// DataDir is where the data volume is mounted in the fill and keeper
	// containers.
	DataDir = "/.taskrun-pod/data"
	// GateClosedExitCode is the gate's status when stdin closed before the
	// executor released it: the command never ran.
	GateClosedExitCode = 125
)

// Main runs the subcommand in args and returns the exit status.
func Main(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "taskrun-pod: subcommand required: fill, gate, stop, hold or pack")
		return 2
	}
	ctx := context.Background()
	var err error
	switch args[0] {
	case "fill":
		if len(args) != 3 {
			err = errors.New("usage: taskrun-pod fill DATA BIN")
			break
		}
		err = fill(ctx, os.Stdin, args[1], args[2])
	case "gate":
		opts, argv, perr := parseGateArgs(args[1:])
		if perr != nil {
			err = perr
			break
		}
		return gate(os.Stdin, argv, opts)
	case "stop":
		var grace time.Duration
		if len(args) == 2 {
			grace, err = time.ParseDuration(args[1])
		} else {
			err = errors.New("usage: taskrun-pod stop GRACE")
		}
		if err == nil {
			stop(grace)
		}
	case "hold":
		if len(args) == 1 {
			hold()
			break
		}
		if len(args) < 3 || args[1] != "--control" {
			err = errors.New("usage: taskrun-pod hold [--control SOCKET [LISTEN...]]")
			break
		}
		err = holdServing(args[2], args[3:])
	case "tunnel":
		if len(args) != 3 {
			err = errors.New("usage: taskrun-pod tunnel CONTROL SOCKET")
			break
		}
		err = tunnel(os.Stdin, os.Stdout, args[1], args[2])
	case "pack":
		if len(args) != 2 {
			err = errors.New("usage: taskrun-pod pack DIR")
			break
		}
		_, err = workspace.PackHome(ctx, args[1], os.Stdout, workspace.PackOptions{})
	default:
		err = fmt.Errorf("unknown subcommand %q", args[0])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "taskrun-pod:", err)
		return 1
	}
	return 0
}

// Fill copies the running program to bin and extracts the fill stream on r
// into data: what the fill container does.
func Fill(ctx context.Context, r io.Reader, data, bin string) error { return fill(ctx, r, data, bin) }

// fill implements Fill.
func fill(ctx context.Context, r io.Reader, data, bin string) error {
	if err := copySelf(filepath.Join(bin, Name)); err != nil {
		return err
	}
	sr, err := NewStreamReader(r)
	if err != nil {
		return err
	}
	for {
		sec, body, err := sr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		dest := filepath.Join(data, sec.Name)
		switch sec.Kind {
		case KindDir:
			if _, err := workspace.UnpackHome(ctx, body, dest, workspace.UnpackOptions{Limits: fillLimits}); err != nil {
				return fmt.Errorf("mount %s: %w", sec.Name, err)
			}
		case KindFile:
			if err := writeFile(dest, os.FileMode(sec.Mode), body); err != nil {
				return fmt.Errorf("mount %s: %w", sec.Name, err)
			}
		}
	}
}

// fillLimits bound a mount's archive in the fill stream. The stream is the
// executor's own (the run's directories as admitted on the host), and the
// data volume bounds what it can hold, so a compressible workspace is never
// refused for its ratio: the grace covers every byte the total allows.
var fillLimits = workspace.UnpackLimits{RatioGrace: workspace.DefaultUnpackLimits.MaxBytes}

// copySelf copies the running executable to dst, read-only and executable.
func copySelf(dst string) error {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer src.Close()
	return writeFile(dst, 0o555, src)
}

// writeFile creates dst (which must not exist) with r's bytes and mode.
func writeFile(dst string, mode os.FileMode, r io.Reader) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// forwarded are the signals the gate passes on to its command.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// GateToken is what the gate writes on stderr, again and again, until the
// executor releases it. Seeing it proves the executor's attach session
// receives stderr, and so stdout, which the runtime attaches first; the
// executor removes every leading token from the stream.
const GateToken = "\x00taskrun-pod-gate\x00\n"

// gateInterval bounds how often the gate repeats its token.
const (
	gateIntervalMin = 10 * time.Millisecond
	gateIntervalMax = 200 * time.Millisecond
)

// GateOpen is what the gate writes on stderr once released, right before
// it starts the command: the executor removes it with the leading tokens,
// and counts stderr from there on (ack.go).
const GateOpen = "\x00taskrun-pod-gate-open\x00\n"

// TerminationLog is the run container's termination message file (the
// Pod's default terminationMessagePath).
const TerminationLog = "/dev/termination-log"

// UnacknowledgedPrefix starts the run container's termination message when
// the gate exited before the executor acknowledged all of the output: the
// executor then reports the output as incomplete.
const UnacknowledgedPrefix = "taskrun-pod gate: output not acknowledged: "

// gate waits for the executor's byte on stdin, announcing itself on stderr
// meanwhile, then runs argv as init and holds its exit until the executor
// acknowledged all of argv's output, or opts.ackIdle passed without
// progress.
func gate(stdin *os.File, argv []string, opts gateOptions) int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	l := newLedger(2)
	released := make(chan bool, 1)
	go func() {
		var b [1]byte
		n, _ := stdin.Read(b[:])
		released <- n == 1
		if n == 1 {
			readAcks(stdin, l)
		}
	}()
	ok := false
	for d := gateIntervalMin; ; d = min(2*d, gateIntervalMax) {
		if _, err := os.Stderr.WriteString(GateToken); err != nil {
			break
		}
		select {
		case ok = <-released:
		case <-time.After(d):
			continue
		}
		break
	}
	if !ok {
		fmt.Fprintln(os.Stderr, "taskrun-pod gate: stdin closed before the executor attached; not starting the command")
		return GateClosedExitCode
	}
	// Not dumpable: the command runs as the same user, and must not open the
	// gate's stdin (to forge acknowledgements) or its stdout and stderr (to
	// write past the count) through /proc/1/fd.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "taskrun-pod gate: make the gate undumpable:", err)
		return GateClosedExitCode
	}
	if _, err := os.Stderr.WriteString(GateOpen); err != nil {
		return GateClosedExitCode
	}
	stdout := &countingWriter{w: os.Stdout, l: l}
	stderr := &countingWriter{w: os.Stderr, l: l, stderr: true}
	code, reaped := runForwarding(argv, stdout, stderr, l, sigs)
	// Whatever the outcome, the status is the command's, and a stalled or
	// gone executor must not keep the Pod. The termination message says
	// whether output may be lost; it is the gate's alone once everything
	// the command left is gone, so the command can neither forge nor clear
	// it.
	msg := ""
	if err := l.settle(opts.ackIdle); err != nil {
		msg = UnacknowledgedPrefix + err.Error()
	}
	select {
	case <-reaped:
	case <-time.After(time.Second):
	}
	writeTerminationMessage(opts.terminationLog, msg)
	return code
}

// writeTerminationMessage replaces the content of the termination message
// file at path, when there is one, with msg.
func writeTerminationMessage(path, msg string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return
	}
	_, _ = f.WriteString(msg)
	_ = f.Close()
}

// runForwarding runs argv with its stdout and stderr on pipes that it
// forwards to stdout and stderr, forwards signals to it, reaps orphans, and
// returns its status once it exited. As init of the container it then kills
// what argv left running, which would hold the pipes open; reaped is closed
// once they are all gone.
func runForwarding(argv []string, stdout, stderr io.Writer, l *ledger, sigs <-chan os.Signal) (code int, reaped <-chan struct{}) {
	done := make(chan struct{})
	fail := func(code int, format string, args ...any) (int, <-chan struct{}) {
		fmt.Fprintf(stderr, "taskrun-pod gate: "+format+"\n", args...)
		l.streamDone()
		l.streamDone()
		close(done)
		return code, done
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return fail(GateClosedExitCode, "%v", err)
	}
	defer null.Close()
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fail(127, "%v", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return fail(126, "%v", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fail(126, "%v", err)
	}
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{null.Fd(), outW.Fd(), errW.Fd()},
	})
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return fail(126, "start %s: %v", argv[0], err)
	}
	forward := func(dst io.Writer, src *os.File) {
		defer l.streamDone()
		// On a failed write, closing the pipe fails the command's writes
		// instead of blocking them.
		defer src.Close()
		_, _ = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 32<<10))
	}
	go forward(stdout, outR)
	go forward(stderr, errR)
	go func() {
		for s := range sigs {
			_ = syscall.Kill(pid, s.(syscall.Signal))
		}
	}()
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			fmt.Fprintln(stderr, "taskrun-pod gate: wait:", err)
			code = 1
			break
		}
		if got != pid {
			continue // an orphan reaped
		}
		if ws.Signaled() {
			code = 128 + int(ws.Signal())
		} else {
			code = ws.ExitStatus()
		}
		break
	}
	if os.Getpid() != 1 {
		close(done)
		return code, done
	}
	// The container would end them as it exits; ending them now closes the
	// pipes they hold, so the forwarding reaches its end.
	_ = syscall.Kill(-1, syscall.SIGKILL)
	go reapOrphans(done)
	return code, done
}

// reapOrphans reaps the processes killed after the command exited, and
// closes done when none is left.
func reapOrphans(done chan<- struct{}) {
	defer close(done)
	for {
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(-1, &ws, 0, nil); err != nil && !errors.Is(err, syscall.EINTR) {
			return
		}
	}
}

// stop sends SIGTERM to the gate and, after grace, SIGKILL to every process
// it may signal (all but the gate and itself); the gate then exits with its
// command's status. A grace of 0 sends SIGKILL alone.
func stop(grace time.Duration) {
	if grace > 0 {
		_ = syscall.Kill(1, syscall.SIGTERM)
		time.Sleep(grace)
	}
	_ = syscall.Kill(-1, syscall.SIGKILL)
}

// hold blocks until SIGTERM or SIGINT.
func hold() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
}

// holdServing serves the tunnel's sockets until SIGTERM or SIGINT.
func holdServing(control string, sockets []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return Serve(ctx, control, sockets)
}

// gateOptions are the gate's flags.
type gateOptions struct {
	// ackIdle bounds the wait for acknowledgements without progress.
	ackIdle time.Duration
	// terminationLog is the container's termination message file.
	terminationLog string
}

// parseGateArgs parses "[--ack-idle D] [--termination-log PATH] -- CMD
// [ARG...]".
func parseGateArgs(args []string) (gateOptions, []string, error) {
	usage := errors.New("usage: taskrun-pod gate [--ack-idle DURATION] [--termination-log PATH] -- CMD [ARG...]")
	opts := gateOptions{ackIdle: DefaultAckIdle, terminationLog: TerminationLog}
	for len(args) >= 2 && args[0] != "--" {
		switch args[0] {
		case "--ack-idle":
			d, err := time.ParseDuration(args[1])
			if err != nil || d <= 0 {
				return gateOptions{}, nil, usage
			}
			opts.ackIdle = d
		case "--termination-log":
			if args[1] == "" || args[1] == "--" {
				return gateOptions{}, nil, usage
			}
			opts.terminationLog = args[1]
		default:
			return gateOptions{}, nil, usage
		}
		args = args[2:]
	}
	if len(args) < 2 || args[0] != "--" {
		return gateOptions{}, nil, usage
	}
	return opts, args[1:], nil
}

// StopCommand is the command that stops the run container with grace.
func StopCommand(grace time.Duration) []string {
	return []string{Path, "stop", grace.String()}
}

// PackCommand is the command the keeper runs to pack the i-th mount.
func PackCommand(i int) []string {
	return []string{ImagePath, "pack", DataDir + "/" + SectionName(i)}
}

// FillCommand is the fill container's command.
func FillCommand() []string {
	return []string{ImagePath, "fill", DataDir, BinDir}
}

// GateCommand is the run container's command: the gate in front of argv,
// waiting up to ackIdle without progress for the executor's
// acknowledgements (0: DefaultAckIdle).
func GateCommand(argv []string, ackIdle time.Duration) []string {
	cmd := []string{Path, "gate"}
	if ackIdle > 0 {
		cmd = append(cmd, "--ack-idle", ackIdle.String())
	}
	return append(append(cmd, "--"), argv...)
}

// HoldCommand is the keeper's command; with sockets, it serves them as the
// model tunnel (tunnel.go).
func HoldCommand(sockets ...string) []string {
	if len(sockets) == 0 {
		return []string{ImagePath, "hold"}
	}
	return append([]string{ImagePath, "hold", "--control", ControlSocket}, sockets...)
}
