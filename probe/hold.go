package probe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/taskrun/taskrun/internal/unixsock"
)

// The hold keeps the agent from starting until the host's live audit of the
// container passed. With --hold SOCKET the self-check, once its own checks
// passed, connects to the host's unix socket SOCKET in the run directory and
// waits for one go-ahead line carrying the run's nonce; anything else (the
// host closing the socket because the audit failed, a wrong line, no answer
// within HoldTimeout) refuses the run with ExitContradiction, and the agent
// never runs. The connection is closed (and close-on-exec) before the
// command starts, and the host removes the socket.

// HoldFlag is the self-check's argument naming the hold socket.
const HoldFlag = "--hold"

// HoldTimeout bounds how long the self-check waits for the go-ahead. The
// host audits within milliseconds of the start; this only bounds a host
// that died meanwhile.
const HoldTimeout = time.Minute

// maxHoldLine bounds what the self-check reads from the hold socket.
const maxHoldLine = 256

// ErrNoGoAhead is returned by AwaitGoAhead when the host did not let the
// agent start.
var ErrNoGoAhead = errors.New("the host did not let the agent start")

// goAhead is the line the host sends once its live audit passed.
func goAhead(nonce string) string { return "TASKRUN-GO " + nonce + "\n" }

// AwaitGoAhead connects to the hold socket sock and waits, at most timeout,
// for the host's go-ahead for nonce. Any other outcome returns an error
// wrapping ErrNoGoAhead.
func AwaitGoAhead(ctx context.Context, sock, nonce string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := unixsock.Dial(sock)
	if err != nil {
		return fmt.Errorf("%w: connect to %s: %w", ErrNoGoAhead, sock, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	line, err := bufio.NewReader(io.LimitReader(conn, maxHoldLine)).ReadString('\n')
	switch {
	case err == nil && line == goAhead(nonce):
		return nil
	case errors.Is(err, io.EOF) && line == "":
		return fmt.Errorf("%w: the host refused the sandbox (its live audit failed, or the run ended)", ErrNoGoAhead)
	case err != nil:
		return fmt.Errorf("%w: %w", ErrNoGoAhead, err)
	default:
		return fmt.Errorf("%w: unexpected answer %q", ErrNoGoAhead, line)
	}
}

// Hold is the host's side of the hold: a unix socket the run's self-check
// connects to, answered once with the go-ahead (Release) or closed without
// one (Close).
type Hold struct {
	path  string
	nonce string
	ln    net.Listener
	once  sync.Once
	err   error
}

// ListenHold listens on path for the self-check of the run with nonce,
// shared with the agent's uid as unixsock.Listen does (the directory is the
// host's; the container cannot replace the socket).
func ListenHold(path string, uid int, nonce string) (*Hold, error) {
	ln, err := unixsock.Listen(path, uid)
	if err != nil {
		return nil, fmt.Errorf("hold socket: %w", err)
	}
	return &Hold{path: path, nonce: nonce, ln: ln}, nil
}

// Release waits for the self-check's connection, closes the hold (its
// socket and directory are gone before the agent can start, so the agent
// never finds them in its run directory) and sends the go-ahead on the
// connection. It returns once that is done, when ctx ends, or when Close is
// called (the run ended first).
func (h *Hold) Release(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = h.Close() })
	defer stop()
	conn, err := h.ln.Accept()
	if err != nil {
		return fmt.Errorf("hold: no self-check connected: %w", errors.Join(ctx.Err(), err))
	}
	defer conn.Close()
	closeErr := h.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err = io.WriteString(conn, goAhead(h.nonce))
	return errors.Join(err, closeErr)
}

// Close closes the hold without a go-ahead: a self-check waiting on it, or
// connecting later, refuses the run. It removes the socket and its
// directory, and may be called any number of times.
func (h *Hold) Close() error {
	h.once.Do(func() {
		h.err = h.ln.Close()
		if err := os.Remove(h.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			h.err = errors.Join(h.err, err)
		}
		_ = os.Remove(filepath.Dir(h.path))
	})
	return h.err
}
