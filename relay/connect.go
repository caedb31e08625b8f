package relay

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
)

// ConnectFlag is the relay's flag that makes it pipe its stdin and stdout
// to one loopback TCP connection: the daemon's forward of a live run's
// declared port (`taskrun-relay -connect 127.0.0.1:PORT`), started as a
// command in the run's container so the connection stays in its network
// namespace.
const ConnectFlag = "connect"

// connect pipes in to a TCP connection to addr, a loopback address, and
// the connection to out, half-closing each direction when its source
// ends, until both directions are done.
func connect(ctx context.Context, addr string, in io.Reader, out io.Writer) error {
	if err := checkLoopback(addr); err != nil {
		return fmt.Errorf("-%s: %w", ConnectFlag, err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	tcp, _ := conn.(*net.TCPConn)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(conn, in)
		if tcp != nil {
			_ = tcp.CloseWrite()
		}
	}()
	_, err = io.Copy(out, conn)
	if f, ok := out.(*os.File); ok {
		_ = f.Close()
	}
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	// The peer closed: what is still read from in has nowhere to go, so
	// the copy from in is not waited for.
	return nil
}
