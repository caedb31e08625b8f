// Package relay lets an unmodified agent reach the run's model
// gateway while its container has network mode none: it listens on loopback
// TCP inside the container (default 127.0.0.1:8411) and forwards every
// connection to the gateway's unix socket, so OPENAI_BASE_URL=
// http://127.0.0.1:8411/v1 works.
//
//	taskrun-relay [-listen ADDR] [-socket PATH] [-egress-socket PATH] [-egress-listen ADDR] [-- CMD ARGS...]
//	taskrun-relay -connect 127.0.0.1:PORT
//
// With -connect it relays nothing: it pipes its stdin and stdout to one TCP
// connection to that loopback address and exits when the connection ends
// (the daemon's forward of a live run's declared port).
//
// For a run with an egress policy ($TASKRUN_EGRESS_SOCKET set) it also
// exposes the egress proxy's socket on 127.0.0.1:8412, where HTTP_PROXY
// and HTTPS_PROXY point.
//
// With a command after "--" it starts the relay, runs the command with
// OPENAI_BASE_URL (http://ADDR/v1) and ANTHROPIC_BASE_URL (http://ADDR)
// pointing at the relay (and placeholder OPENAI_API_KEY and
// ANTHROPIC_API_KEY if none is set: the real key stays on the host), and
// exits with its status. The command also gets TASKRUN_RELAY, the address
// the relay listens on: a relay started under it with the same address (the
// agent's own `taskrun-relay -- AGENT` in a run where taskrun already runs
// the agent behind one) serves nothing and just runs its command, so one
// command line works whether or not taskrun started the relay.
//
// Main is the whole program; the taskrun binary runs it when invoked as
// taskrun-relay (package helpers), and cmd/taskrun-relay builds it alone.
package relay

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
)

// OuterEnv names the variable a relay sets for its command: the loopback
// address it listens on.
const OuterEnv = "TASKRUN_RELAY"

// errBadUsage marks invalid flags.
var errBadUsage = errors.New("invalid usage")

// options are the relay's flags.
type options struct {
	listen  string
	socket  string
	egress  *egressOptions
	command []string
	// outer is $TASKRUN_RELAY: the address of a relay this one runs under.
	outer string
	// connect is a loopback address to pipe stdin and stdout to, instead
	// of relaying (ConnectFlag).
	connect string
}

// Main runs the relay with the arguments after the program name and returns
// the exit status. SIGINT and SIGTERM stop it.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts, err := parseOptions(args, os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "taskrun-relay: %v\n", err)
		return 2
	}
	code, err := run(ctx, opts, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "taskrun-relay: %v\n", err)
	}
	return code
}

// parseOptions reads flags, environment defaults and the command after "--".
func parseOptions(args []string, getenv func(string) string) (options, error) {
	fs := flag.NewFlagSet("taskrun-relay", flag.ContinueOnError)
	var o options
	socket := getenv("TASKRUN_MODEL_SOCKET")
	if socket == "" {
		socket = "/taskrun/.gateway/model.sock"
	}
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8411", "loopback address to listen on")
	fs.StringVar(&o.socket, "socket", socket, "model gateway unix socket (default $TASKRUN_MODEL_SOCKET)")
	o.egress = egressFlags(fs, getenv)
	fs.StringVar(&o.connect, ConnectFlag, "", "pipe stdin and stdout to one TCP connection to this loopback address, and relay nothing else")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("%w: %w", errBadUsage, err)
	}
	o.command = fs.Args()
	o.outer = getenv(OuterEnv)
	if err := checkLoopback(o.listen); err != nil {
		return o, fmt.Errorf("-listen: %w", err)
	}
	if o.connect != "" {
		if err := checkLoopback(o.connect); err != nil {
			return o, fmt.Errorf("-%s: %w", ConnectFlag, err)
		}
		if len(o.command) > 0 {
			return o, fmt.Errorf("%w: -%s takes no command", errBadUsage, ConnectFlag)
		}
	}
	if err := o.egress.check(); err != nil {
		return o, err
	}
	return o, nil
}

// checkLoopback refuses a listen address that is not on loopback.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: %q: %w", errBadUsage, addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%w: %q is not a loopback address: use 127.0.0.1:PORT", errBadUsage, addr)
	}
	return nil
}

// run serves the relay, alone or around a command, and returns the exit code.
// Under a relay that already listens on o.listen it only runs the command.
func run(ctx context.Context, o options, log *slog.Logger) (int, error) {
	if o.connect != "" {
		if err := connect(ctx, o.connect, os.Stdin, os.Stdout); err != nil {
			return 1, err
		}
		return 0, nil
	}
	if len(o.command) > 0 && o.outer == o.listen {
		return runCommand(ctx, o.command, o.listen)
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return 1, fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	stopEgress, err := startEgressRelay(ctx, o.egress, log)
	if err != nil {
		return 1, err
	}
	defer stopEgress()
	r := &relay{socket: o.socket, log: log}
	if len(o.command) == 0 {
		log.Info("relaying", "listen", ln.Addr().String(), "socket", o.socket)
		if err := r.serve(ctx, ln); err != nil {
			return 1, err
		}
		return 0, nil
	}
	go func() { _ = r.serve(ctx, ln) }()
	return runCommand(ctx, o.command, ln.Addr().String())
}
