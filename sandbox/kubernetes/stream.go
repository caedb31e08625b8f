package kubernetes

import (
	"context"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
)

// streamIO is one attach or exec session's streams; a nil field is not
// requested.
type streamIO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// TTY runs the session on a terminal, resized from Sizes when set.
	TTY   bool
	Sizes remotecommand.TerminalSizeQueue
}

// attach attaches to a running container of the run's Pod until the
// container exits, ctx ends or the streams fail.
func (b *Backend) attach(ctx context.Context, pod, container string, s streamIO) error {
	opts := &corev1.PodAttachOptions{Container: container, Stdin: s.Stdin != nil, Stdout: s.Stdout != nil, Stderr: s.Stderr != nil}
	return b.remote(ctx, pod, "attach", opts, s)
}

// exec runs cmd in a running container of the run's Pod until it exits; a
// non-zero exit is an error (an exec.CodeExitError).
func (b *Backend) exec(ctx context.Context, pod, container string, cmd []string, s streamIO) error {
	opts := &corev1.PodExecOptions{Container: container, Command: cmd, Stdin: s.Stdin != nil, Stdout: s.Stdout != nil, Stderr: s.Stderr != nil}
	return b.remote(ctx, pod, "exec", opts, s)
}

// remote runs one attach or exec session over WebSockets, falling back to
// SPDY for an API server that does not upgrade to WebSockets.
func (b *Backend) remote(ctx context.Context, pod, sub string, opts runtime.Object, s streamIO) error {
	u := b.client.streamURL(b.namespace, pod, sub, opts)
	ws, err := remotecommand.NewWebSocketExecutor(b.config, "GET", u.String())
	if err != nil {
		return fmt.Errorf("%s %s: %w", sub, pod, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(b.config, "POST", u)
	if err != nil {
		return fmt.Errorf("%s %s: %w", sub, pod, err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return fmt.Errorf("%s %s: %w", sub, pod, err)
	}
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: s.Stdin, Stdout: s.Stdout, Stderr: s.Stderr, Tty: s.TTY, TerminalSizeQueue: s.Sizes}); err != nil {
		return fmt.Errorf("%s %s: %w", sub, pod, err)
	}
	return nil
}
