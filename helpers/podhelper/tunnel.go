package podhelper

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// The model tunnel: the executor's unix sockets (the model gateway's, the
// egress proxy's) reach the run container without anything of the
// executor's, the model key least of all, entering the Pod. The keeper
// listens on each socket's path in the data volume, and on a control socket
// in a volume only it mounts. For every agent connection the executor keeps
// a `taskrun-pod tunnel CONTROL SOCKET` session (exec in the keeper) waiting:
// the tunnel connects to the control socket and names its socket; the keeper
// answers TunnelReady, and TunnelPaired once it hands the tunnel an agent
// connection, after which the session carries that connection's bytes and
// the executor dials the host socket for it.
const (
	// TunnelDir is where the keeper's private tunnel volume is mounted.
	TunnelDir = "/.taskrun-pod/tunnel"
	// ControlSocket is the keeper's control socket.
	ControlSocket = TunnelDir + "/control.sock"
	// TunnelReady is the keeper's first byte to a registered tunnel.
	TunnelReady = 'r'
	// TunnelPaired is its second, sent when an agent connection is handed over.
	TunnelPaired = 'p'
	// pairTimeout bounds how long an agent connection waits for a tunnel.
	pairTimeout = 30 * time.Second
)

// keeper pairs agent connections with waiting tunnels.
type keeper struct {
	mu      sync.Mutex
	waiting map[string]chan net.Conn
}

// queue is the channel of tunnels waiting for socket.
func (k *keeper) queue(socket string) chan net.Conn {
	k.mu.Lock()
	defer k.mu.Unlock()
	q, ok := k.waiting[socket]
	if !ok {
		q = make(chan net.Conn, 64)
		k.waiting[socket] = q
	}
	return q
}

// Serve listens on sockets, then on control, and pairs connections until
// ctx ends. Listening on the sockets first means a registered tunnel proves
// they are ready.
func Serve(ctx context.Context, control string, sockets []string) error {
	k := &keeper{waiting: map[string]chan net.Conn{}}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, s := range sockets {
		if err := os.MkdirAll(filepath.Dir(s), 0o755); err != nil {
			return err
		}
		l, err := net.Listen("unix", s)
		if err != nil {
			return err
		}
		ls = append(ls, l)
		go k.acceptAgents(ctx, l, s)
	}
	cl, err := net.Listen("unix", control)
	if err != nil {
		return err
	}
	ls = append(ls, cl)
	go k.acceptTunnels(cl, sockets)
	<-ctx.Done()
	return nil
}

// acceptTunnels registers each tunnel under the socket it names.
func (k *keeper) acceptTunnels(l net.Listener, sockets []string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			name, err := bufio.NewReaderSize(c, 16).ReadString('\n')
			name = strings.TrimSuffix(name, "\n")
			known := false
			for _, s := range sockets {
				known = known || s == name
			}
			if err != nil || !known {
				c.Close()
				return
			}
			if _, err := c.Write([]byte{TunnelReady}); err != nil {
				c.Close()
				return
			}
			k.queue(name) <- c
		}()
	}
}

// acceptAgents hands each agent connection on socket to a waiting tunnel.
func (k *keeper) acceptAgents(ctx context.Context, l net.Listener, socket string) {
	for {
		a, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer a.Close()
			var t net.Conn
			select {
			case t = <-k.queue(socket):
			case <-time.After(pairTimeout):
				return
			case <-ctx.Done():
				return
			}
			defer t.Close()
			if _, err := t.Write([]byte{TunnelPaired}); err != nil {
				return
			}
			bridge(a, t)
		}()
	}
}

// bridge copies both ways until both directions ended.
func bridge(a, b net.Conn) {
	var wg sync.WaitGroup
	half := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go half(a, b)
	go half(b, a)
	wg.Wait()
}

// tunnel connects to the keeper's control socket for socket and carries
// the connection over stdin and stdout.
func tunnel(stdin io.Reader, stdout io.Writer, control, socket string) error {
	c, err := net.Dial("unix", control)
	if err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, socket+"\n"); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, stdin)
		if uc, ok := c.(*net.UnixConn); ok {
			_ = uc.CloseWrite()
		}
		done <- err
	}()
	_, err = io.Copy(stdout, c)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// TunnelCommand is the command the executor execs in the keeper for one
// connection to socket.
func TunnelCommand(socket string) []string {
	return []string{ImagePath, "tunnel", ControlSocket, socket}
}

// ErrTunnelRefused is returned by Carry when the keeper closed the session
// without registering it.
var ErrTunnelRefused = errors.New("the keeper refused the tunnel")

// Carry is the executor's end of one tunnel session: from reads the
// session's stdout, to writes its stdin. It calls ready once the keeper
// registered the tunnel and paired once an agent connection arrived, then
// dials the executor's socket and carries the bytes both ways until both
// directions ended.
func Carry(from io.Reader, to io.WriteCloser, ready, paired func(), dial func() (net.Conn, error)) error {
	var b [1]byte
	if _, err := io.ReadFull(from, b[:]); err != nil || b[0] != TunnelReady {
		return fmt.Errorf("%w (%v)", ErrTunnelRefused, err)
	}
	ready()
	if _, err := io.ReadFull(from, b[:]); err != nil || b[0] != TunnelPaired {
		return fmt.Errorf("tunnel ended unpaired: %v", err)
	}
	paired()
	up, err := dial()
	if err != nil {
		to.Close()
		return fmt.Errorf("dial the executor's socket: %w", err)
	}
	defer up.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(to, up)
		to.Close()
	}()
	_, _ = io.Copy(up, from)
	if uc, ok := up.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	<-done
	return nil
}
