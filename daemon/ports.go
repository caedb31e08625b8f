package daemon

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/relay"
	"github.com/taskrun/taskrun/sandbox/docker"
)

// Paths of a live run's declared ports.
const (
	// PathPorts: GET lists the run's declared ports with their tokens
	// (PortInfo), to the run's tenant only.
	PathPorts = "/v1/runs/{id}/ports"
	// PathPort: any method is proxied over HTTP to the port inside the
	// run's container, at the path after the port, with the port's token
	// in the PortTokenHeader.
	PathPort = "/v1/runs/{id}/ports/{port}/{rest...}"
)

// PortTokenHeader carries a declared port's token on a call to PathPort;
// it is not passed on to the agent.
const PortTokenHeader = "X-Taskrun-Port-Token"

// Bounds of the port forwards.
const (
	// MaxPorts is how many ports a live run may declare.
	MaxPorts = 8
	// MaxPortConns is how many connections to its ports a live run has at
	// once; one more is refused with 429.
	MaxPortConns = 16
	// MaxPortBytes bounds the bytes of one connection to a port, both ways
	// together: past it the connection is cut.
	MaxPortBytes = 64 << 20
)

// PortInfo is a live run's declared port: the path it answers on, under
// the daemon's socket, and its token.
type PortInfo struct {
	Port  int    `json:"port"`
	Path  string `json:"path"`
	Token string `json:"token"`
}

// Errors of the port forwards.
var (
	// ErrTooManyPortConns is a connection over MaxPortConns.
	ErrTooManyPortConns = errors.New("too many connections to the run's ports")
	// ErrPortBytes is a connection that carried MaxPortBytes.
	ErrPortBytes = errors.New("the connection carried its most bytes")
)

// checkPorts refuses a declaration of more than MaxPorts ports, a
// duplicate, or a port outside 1-65535.
func checkPorts(ports []int) error {
	if len(ports) > MaxPorts {
		return fmt.Errorf("ports: %d declared, at most %d", len(ports), MaxPorts)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("port %d: not within 1-65535", p)
		}
		if seen[p] {
			return fmt.Errorf("port %d: declared twice", p)
		}
		seen[p] = true
	}
	return nil
}

// portTokens makes a fresh random token for each port.
func portTokens(ports []int) (map[int]string, error) {
	out := make(map[int]string, len(ports))
	for _, p := range ports {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return nil, fmt.Errorf("port %d: token: %w", p, err)
		}
		out[p] = base64.RawURLEncoding.EncodeToString(b)
	}
	return out, nil
}

// portPath is the path a run's port answers on.
func portPath(runID string, port int) string {
	return "/v1/runs/" + url.PathEscape(runID) + "/ports/" + strconv.Itoa(port) + "/"
}

// portInfos are a run's declared ports, lowest first.
func (r *liveRun) portInfos() []PortInfo {
	out := make([]PortInfo, 0, len(r.ports))
	for p, tok := range r.ports {
		out = append(out, PortInfo{Port: p, Path: portPath(r.ref.RunID, p), Token: tok})
	}
	slices.SortFunc(out, func(a, b PortInfo) int { return a.Port - b.Port })
	return out
}

// servePorts lists the peer's live run's declared ports and their tokens.
func (s *Server) servePorts(w http.ResponseWriter, r *http.Request) {
	run, _, ok := s.liveOf(w, r)
	if !ok {
		return
	}
	answerJSON(w, http.StatusOK, run.portInfos())
}

// servePort proxies a call over HTTP to a declared port of the peer's live
// run, inside its container's own network namespace: a run of another
// tenant, or a port not declared, is 404; a missing or wrong token 401.
func (s *Server) servePort(w http.ResponseWriter, r *http.Request) {
	run, _, ok := s.liveOf(w, r)
	if !ok {
		return
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	token, declared := run.ports[port]
	if err != nil || !declared {
		refuse(w, http.StatusNotFound, fmt.Errorf("run %s: no declared port %q", run.ref.RunID, r.PathValue("port")))
		return
	}
	got := r.Header.Get(PortTokenHeader)
	// An empty token never matches, even if a port's were empty.
	if got == "" || token == "" || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="taskrun port"`)
		refuse(w, http.StatusUnauthorized, fmt.Errorf("run %s port %d: missing or wrong %s", run.ref.RunID, port, PortTokenHeader))
		return
	}
	eng, status, err := s.engineOf(r.Context(), run)
	if err != nil {
		refuse(w, status, err)
		return
	}
	prefix := portPath(run.ref.RunID, port)
	target := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.Header.Del(PortTokenHeader)
			pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
			// The path after the port, as the caller escaped it.
			pr.Out.URL.Path, pr.Out.URL.RawPath = "/"+r.PathValue("rest"), ""
			if seg := strings.SplitN(r.URL.EscapedPath(), "/", 7); len(seg) == 7 {
				pr.Out.URL.RawPath = "/" + seg[6]
			}
			pr.Out.Host = target.Host
			pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
		},
		Transport: &http.Transport{
			// One connection, one forward, per call: none is kept.
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.dialPort(ctx, eng, run, port)
			},
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			status := http.StatusBadGateway
			if errors.Is(err, ErrTooManyPortConns) {
				status = http.StatusTooManyRequests
			}
			s.log.Debug("port forward failed", "run", run.ref.RunID, "port", port, "err", err)
			refuse(w, status, fmt.Errorf("run %s port %d: %w", run.ref.RunID, port, err))
		},
	}
	proxy.ServeHTTP(w, r)
}

// dialPort opens a connection to port inside the run's container: a
// taskrun-relay -connect started there as the run's user, its stdin and
// stdout the connection's two ways. It holds one of the run's
// MaxPortConns until its exec ended (closing it ends its exec).
func (s *Server) dialPort(ctx context.Context, eng runEngine, run *liveRun, port int) (net.Conn, error) {
	select {
	case run.portConns <- struct{}{}:
	default:
		return nil, ErrTooManyPortConns
	}
	execCtx, cancel := context.WithCancel(run.ctx)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &portConn{in: inW, out: outR, cancel: cancel}
	started := make(chan struct{})
	done := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// The slot is the exec's: it is free once the exec is gone.
		defer func() { <-run.portConns }()
		var stderr boundedBuffer
		exit, err := docker.Exec(execCtx, eng.cli, eng.id, docker.ExecOptions{User: eng.user,
			Cmd:   []string{helpers.RelayPath, "-" + relay.ConnectFlag, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))},
			Stdin: inR, Stdout: outW, Stderr: &stderr,
			Started: func(string) { close(started) }})
		if err == nil && exit != 0 {
			err = fmt.Errorf("%w: exit %d: %s", errPortForward, exit, stderr.String())
		}
		_ = outW.CloseWithError(io.EOF)
		_ = inR.Close()
		done <- err
	}()
	select {
	case <-started:
		return c, nil
	case err := <-done:
		cancel()
		if err == nil {
			err = errPortForward
		}
		return nil, err
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	}
}

// errPortForward is a forward that could not reach the port.
var errPortForward = errors.New("the port forward ended")

// portConn is one connection to a run's port over an exec's stdin and
// stdout, cut after MaxPortBytes.
type portConn struct {
	in     *io.PipeWriter
	out    *io.PipeReader
	cancel context.CancelFunc
	bytes  atomic.Int64
	closed sync.Once
}

func (c *portConn) count(n int) error {
	if c.bytes.Add(int64(n)) > MaxPortBytes {
		_ = c.Close()
		return ErrPortBytes
	}
	return nil
}

func (c *portConn) Read(b []byte) (int, error) {
	n, err := c.out.Read(b)
	if cerr := c.count(n); cerr != nil && err == nil {
		err = cerr
	}
	return n, err
}

func (c *portConn) Write(b []byte) (int, error) {
	if c.bytes.Load()+int64(len(b)) > MaxPortBytes {
		_ = c.Close()
		return 0, ErrPortBytes
	}
	n, err := c.in.Write(b)
	if cerr := c.count(n); cerr != nil && err == nil {
		err = cerr
	}
	return n, err
}

// CloseWrite ends the connection's way in: the port sees EOF.
func (c *portConn) CloseWrite() error { return c.in.Close() }

// Close ends the connection and its exec.
func (c *portConn) Close() error {
	c.closed.Do(func() {
		_ = c.in.Close()
		_ = c.out.Close()
		c.cancel()
	})
	return nil
}

func (c *portConn) LocalAddr() net.Addr              { return portAddr{} }
func (c *portConn) RemoteAddr() net.Addr             { return portAddr{} }
func (c *portConn) SetDeadline(time.Time) error      { return nil }
func (c *portConn) SetReadDeadline(time.Time) error  { return nil }
func (c *portConn) SetWriteDeadline(time.Time) error { return nil }

// portAddr names the far end of a portConn.
type portAddr struct{}

func (portAddr) Network() string { return "taskrun-exec" }
func (portAddr) String() string  { return "taskrun-exec" }

// boundedBuffer keeps the first 4 KiB written to it.
type boundedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := 4096 - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
