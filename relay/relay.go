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

// runCommand runs argv with OPENAI_BASE_URL pointing at the relay and
// returns its exit code; SIGINT and SIGTERM reach it through ctx.
func runCommand(ctx context.Context, argv []string, addr string) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "OPENAI_BASE_URL=http://"+addr+"/v1")
	if os.Getenv("OPENAI_API_KEY") == "" {
		// SDKs insist on a key; the real one never leaves the host.
		cmd.Env = append(cmd.Env, "OPENAI_API_KEY=taskrun-gateway")
	}
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
