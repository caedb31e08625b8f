package relay

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"

	"github.com/taskrun/taskrun/egress"
)

// egressOptions say where the relay exposes the run's egress proxy.
type egressOptions struct {
	socket string
	listen string
}

// egressFlags registers the egress relay's flags; the socket defaults to
// $TASKRUN_EGRESS_SOCKET, set only for runs with an egress policy.
func egressFlags(fs *flag.FlagSet, getenv func(string) string) *egressOptions {
	var o egressOptions
	fs.StringVar(&o.socket, "egress-socket", getenv(egress.SocketEnv), "egress proxy unix socket (default $"+egress.SocketEnv+"); empty: no egress relay")
	fs.StringVar(&o.listen, "egress-listen", egress.RelayAddr, "loopback address HTTP_PROXY points at")
	return &o
}

// check refuses a non-loopback egress listen address.
func (o *egressOptions) check() error {
	if o.socket == "" {
		return nil
	}
	if err := checkLoopback(o.listen); err != nil {
		return fmt.Errorf("-egress-listen: %w", err)
	}
	return nil
}

// startEgressRelay serves the egress proxy's socket on loopback TCP until
// ctx ends; with no socket configured it does nothing.
func startEgressRelay(ctx context.Context, o *egressOptions, log *slog.Logger) (func(), error) {
	if o == nil || o.socket == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, fmt.Errorf("listen for the egress proxy: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = (&relay{socket: o.socket, log: log}).serve(ctx, ln)
	}()
	log.Debug("relaying egress", "listen", ln.Addr().String(), "socket", o.socket)
	return func() { cancel(); ln.Close(); <-done }, nil
}
