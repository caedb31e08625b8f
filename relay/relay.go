package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// relay forwards TCP connections to a unix socket, byte for byte, so
// streamed responses pass through as they are written.
type relay struct {
	socket string
	log    *slog.Logger
}

// serve accepts connections until ctx is cancelled or ln is closed.
func (r *relay) serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.forward(ctx, conn)
		}()
	}
}

// forward pipes one connection to the socket and back, half-closing each
// direction when its source ends.
func (r *relay) forward(ctx context.Context, client net.Conn) {
	defer client.Close()
	var d net.Dialer
	upstream, err := d.DialContext(ctx, "unix", r.socket)
	if err != nil {
		r.log.Warn("model gateway unreachable", "socket", r.socket, "err", err)
		return
	}
	defer upstream.Close()
	stop := context.AfterFunc(ctx, func() {
		client.Close()
		upstream.Close()
	})
	defer stop()
	done := make(chan struct{})
	go func() {
		pipe(upstream, client)
		close(done)
	}()
	pipe(client, upstream)
	<-done
}

// pipe copies src to dst, then closes dst's write side.
func pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// runCommand runs argv with OPENAI_BASE_URL and ANTHROPIC_BASE_URL pointing
// at the relay and returns its exit code; SIGINT and SIGTERM reach it
// through ctx.
func runCommand(ctx context.Context, argv []string, addr string) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), commandEnv(os.Getenv, addr)...)
	if err := cmd.Start(); err != nil {
		return 127, fmt.Errorf("start %s: %w", argv[0], err)
	}
	stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Signal(syscall.SIGTERM) })
	defer stop()
	err := cmd.Wait()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exitErr):
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return exitErr.ExitCode(), nil
	default:
		return 1, fmt.Errorf("wait for %s: %w", argv[0], err)
	}
}

// Placeholder keys for SDKs that insist on one; the real key never leaves the host.
const (
	placeholderOpenAIKey    = "taskrun-gateway"
	placeholderAnthropicKey = "taskrun-gateway"
)

// commandEnv is what the command gets on top of the relay's environment:
// both SDKs' base URLs pointing at the relay, placeholder keys where none
// is set, and the relay's address in OuterEnv.
func commandEnv(getenv func(string) string, addr string) []string {
	env := []string{
		"OPENAI_BASE_URL=http://" + addr + "/v1",
		"ANTHROPIC_BASE_URL=http://" + addr,
		OuterEnv + "=" + addr,
	}
	if getenv("OPENAI_API_KEY") == "" {
		env = append(env, "OPENAI_API_KEY="+placeholderOpenAIKey)
	}
	if getenv("ANTHROPIC_API_KEY") == "" && getenv("ANTHROPIC_AUTH_TOKEN") == "" {
		env = append(env, "ANTHROPIC_API_KEY="+placeholderAnthropicKey)
	}
	return env
}
