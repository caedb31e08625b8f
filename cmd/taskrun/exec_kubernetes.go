package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/moby/term"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox/kubernetes"
)

// execInPod runs cmd in the run container of rec's live Pod in namespace
// and returns its exit status: taskrun exec for a run on Kubernetes.
func execInPod(ctx context.Context, a *app, rec *runindex.Record, kubeconfig, namespace string, cmd []string, raw bool) (int, error) {
	cfg, err := kubernetes.ConfigFromKubeconfig(kubeconfig)
	if err != nil {
		return 0, err
	}
	b, err := kubernetes.New(ctx, cfg, namespace, kubernetes.WithLogger(a.log))
	if err != nil {
		return 0, err
	}
	inFd, inTerm := term.GetFdInfo(stdinFile)
	outFd, outTerm := term.GetFdInfo(a.stdout)
	tty := inTerm && outTerm
	opts := kubernetes.ExecOptions{Cmd: cmd, Stdin: stdinFile, Stdout: a.stdout, Stderr: a.stderr, TTY: tty}
	var flushes []func() error
	if !raw {
		o, fo := a.terminalSafe(a.stdout)
		e, fe := a.terminalSafe(a.stderr)
		opts.Stdout, opts.Stderr, flushes = o, e, []func() error{fo, fe}
	}
	if tty {
		state, err := term.SetRawTerminal(inFd)
		if err == nil {
			defer term.RestoreTerminal(inFd, state) //nolint:errcheck // best effort on the way out
		}
		sizes := newWindowSizes(outFd)
		defer sizes.stop()
		opts.Sizes = sizes
	}
	exit, err := b.ExecInRun(ctx, rec.UserID, rec.RunID, opts)
	for _, f := range flushes {
		_ = f()
	}
	return exit, err
}

// windowSizes is a remotecommand.TerminalSizeQueue of the terminal at fd:
// its size now, then again at every SIGWINCH.
type windowSizes struct {
	fd   uintptr
	sig  chan os.Signal
	done chan struct{}
	sent bool
}

func newWindowSizes(fd uintptr) *windowSizes {
	w := &windowSizes{fd: fd, sig: make(chan os.Signal, 1), done: make(chan struct{})}
	signal.Notify(w.sig, syscall.SIGWINCH)
	return w
}

// Next blocks until the terminal's size changes (the first call returns it
// at once) and returns nil once stopped.
func (w *windowSizes) Next() *remotecommand.TerminalSize {
	for {
		if w.sent {
			select {
			case <-w.sig:
			case <-w.done:
				return nil
			}
		}
		w.sent = true
		if ws, err := term.GetWinsize(w.fd); err == nil {
			return &remotecommand.TerminalSize{Width: ws.Width, Height: ws.Height}
		}
	}
}

func (w *windowSizes) stop() { signal.Stop(w.sig); close(w.done) }
