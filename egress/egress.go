// Package egress is the per-run egress proxy that runs in the executor.
//
// A run's container keeps network mode none. When the run has a Policy, the
// executor starts a Proxy that listens on a unix socket in the run
// directory (SocketName, next to the model gateway's); inside the container
// the relay exposes it on loopback TCP (RelayAddr) and ContainerEnv points
// HTTP_PROXY and HTTPS_PROXY at it. Plain HTTP requests are proxied; HTTPS
// goes through CONNECT.
//
// Policy: deny by default. A rule allows a host (exact, "*.suffix" or an IP
// literal), one port or the standard ports 80 and 443, and optionally
// methods and path prefixes. The proxy resolves names itself, refuses
// loopback, private, link-local, CGNAT, multicast, reserved and cloud
// metadata addresses unless a rule names that IP literal, and connects to
// exactly the address it checked: one lookup per connection, so a rebinding
// resolver cannot swap the address after the check. Every connection
// attempt counts against the run's connection budget and every byte
// against its byte budget; once one is spent, new connections are refused
// and open ones end.
//
// Denials are readable: 403 with a short text body naming the rule (or its
// absence) and the flag an operator would use to allow the destination.
//
// Credential brokering: for a host with a Credential, or a rule limiting
// methods or paths, the proxy terminates TLS with a leaf certificate from a
// CA generated for the run (its key stays in this process; its certificate
// is written next to the socket and named by SSL_CERT_FILE and friends),
// checks each request and, over TLS to the real upstream, sets the header.
// Every other host is tunneled untouched. The value is read on the host and
// never written anywhere: not to the record, the logs or the run dir.
//
// Record: one Entry per tunnel or inspected request, as JSON lines to
// Config.Record (the run's egress.jsonl), and a Summary for audit.json.
//
// Finishing a run: Close, then read Summary and Err.
package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/taskrun/taskrun/internal/unixsock"
)

// Names of the proxy's files in the run's helper directory (the model
// gateway's directory, e.g. <runDir>/.gateway), and the loopback address the
// relay exposes the proxy on inside the container.
const (
	SocketName = "egress.sock"
	CAName     = "egress-ca.pem"
	BundleName = "egress-ca-bundle.pem"
	RecordName = "egress.jsonl"
	RelayAddr  = "127.0.0.1:8412"
	// SocketEnv tells the relay where the proxy's socket is inside the container.
	SocketEnv = "TASKRUN_EGRESS_SOCKET"
)

// DefaultAgentUID is the uid the agent runs as inside the container.
const DefaultAgentUID = 10001

// ErrBudgetExceeded is wrapped by Err after the run spent its byte or
// connection budget.
var ErrBudgetExceeded = errors.New("egress budget exceeded")

// ErrBadConfig is wrapped by Start's errors for an unusable Config.
var ErrBadConfig = errors.New("invalid egress proxy configuration")

// Resolver looks up a host's addresses; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer connects to an address; *net.Dialer is one. The proxy only ever
// passes it an IP:port it has checked.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config configures one run's proxy.
type Config struct {
	// SocketPath is the unix socket to listen on, <runDir>/.gateway/egress.sock.
	// The CA files are written to its directory.
	SocketPath string
	// Policy is the run's policy; it must not be zero.
	Policy Policy
	// Record receives one JSON line per connection; nil disables it.
	Record io.Writer
	// Logger logs proxy events; nil uses slog.Default().
	Logger *slog.Logger
	// AgentUID owns the socket when the proxy runs as root; 0 means DefaultAgentUID.
	AgentUID int
	// Resolver resolves names; nil uses net.DefaultResolver.
	Resolver Resolver
	// Dialer connects upstream; nil uses a net.Dialer with a 10 s timeout.
	Dialer Dialer
	// UpstreamRoots verifies upstream TLS servers of intercepted hosts; nil
	// uses the host's system roots.
	UpstreamRoots *x509.CertPool
	// Getenv reads credential values named by value_env; nil uses os.Getenv.
	Getenv func(string) string
	// Now is the clock for certificates and the record; nil uses time.Now.
	Now func() time.Time
}

// Server limits: a run gets a bounded number of simultaneous client
// connections, and slow clients cannot hold them forever.
const (
	maxClientConns    = 64
	readHeaderTimeout = 30 * time.Second
	dialTimeout       = 10 * time.Second
	idleTimeout       = 2 * time.Minute
	upstreamTimeout   = 5 * time.Minute
)

// Proxy is a running per-run egress proxy.
type Proxy struct {
	cfg        Config
	log        *slog.Logger
	rules      []Rule
	creds      map[string][]brokered
	ca         *runCA
	caPath     string
	bundlePath string
	rec        *recorder
	budget     *budget
	transport  *http.Transport
	srv        *http.Server
	served     chan error

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	tunnels sync.WaitGroup
	closed  bool
	ctx     context.Context
	cancel  context.CancelFunc
}

// brokered is a credential with its value, read on the host.
type brokered struct {
	header string
	value  string
}

// Start validates cfg, reads credential values on the host, creates the run
// CA when some host is intercepted, listens on cfg.SocketPath and serves
// until Close or ctx is cancelled.
func Start(ctx context.Context, cfg Config) (*Proxy, error) {
	if cfg.SocketPath == "" {
		return nil, fmt.Errorf("%w: SocketPath is empty: set it to <runDir>/.gateway/%s", ErrBadConfig, SocketName)
	}
	if cfg.Policy.IsZero() {
		return nil, fmt.Errorf("%w: the policy allows nothing: a run without a policy gets no proxy", ErrBadConfig)
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AgentUID == 0 {
		cfg.AgentUID = DefaultAgentUID
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Dialer == nil {
		cfg.Dialer = &net.Dialer{Timeout: dialTimeout}
	}
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Proxy{
		cfg:    cfg,
		log:    cfg.Logger.With("component", "egress", "socket", cfg.SocketPath),
		rules:  cfg.Policy.Rules,
		creds:  map[string][]brokered{},
		rec:    newRecorder(cfg.Record),
		budget: newBudget(cfg.Policy.MaxBytes, cfg.Policy.MaxConnections),
		served: make(chan error, 1),
		conns:  map[net.Conn]struct{}{},
	}
	for _, c := range cfg.Policy.Credentials {
		v, err := c.resolveValue(cfg.Getenv)
		if err != nil {
			return nil, err
		}
		p.creds[c.Host] = append(p.creds[c.Host], brokered{header: c.Header, value: v})
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.transport = p.newTransport()
	ln, err := unixsock.Listen(cfg.SocketPath, cfg.AgentUID)
	if err != nil {
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	if hosts := p.interceptedHosts(); len(hosts) > 0 {
		if p.ca, err = newRunCA(hosts, cfg.Now); err == nil {
			p.caPath, p.bundlePath, err = p.ca.writeFiles(filepath.Dir(cfg.SocketPath))
		}
		if err != nil {
			ln.Close()
			_ = os.Remove(cfg.SocketPath)
			return nil, fmt.Errorf("egress proxy: %w", err)
		}
	}
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	go func() { p.served <- p.srv.Serve(netutil.LimitListener(ln, maxClientConns)) }()
	go func() {
		select {
		case <-ctx.Done():
			_ = p.Close()
		case <-p.ctx.Done():
		}
	}()
	p.log.Info("egress proxy started", "rules", len(p.rules), "credentials", len(cfg.Policy.Credentials), "intercepted", p.interceptedHosts())
	return p, nil
}

// interceptedHosts are the rule hosts and credential hosts whose requests
// the proxy must see in clear.
func (p *Proxy) interceptedHosts() []string {
	var hosts []string
	for _, r := range p.rules {
		if r.inspects() && !slices.Contains(hosts, r.Host) {
			hosts = append(hosts, r.Host)
		}
	}
	for h := range p.creds {
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	slices.Sort(hosts)
	return hosts
}

// SocketPath is the socket the proxy listens on.
func (p *Proxy) SocketPath() string { return p.cfg.SocketPath }

// CAPath is the run CA's certificate on the host, or "" when no host is
// intercepted.
func (p *Proxy) CAPath() string { return p.caPath }

// BundlePath is the system roots plus the run CA on the host, or "" when
// no host is intercepted.
func (p *Proxy) BundlePath() string { return p.bundlePath }

// Summary totals the connections so far; after Close it is final.
func (p *Proxy) Summary() Summary {
	s := p.rec.summary()
	if err := p.budget.err(); err != nil {
		s.BudgetExceeded = err.Error()
	}
	return s
}

// Err returns nil while the run is within its budgets, else an error
// wrapping ErrBudgetExceeded that names the budget.
func (p *Proxy) Err() error { return p.budget.err() }

// ContainerEnv is the environment that sends a container's HTTP clients
// through the relay to the proxy, with dir the in-container directory
// holding the socket and CA files (e.g. /taskrun/.gateway). With
// intercepted hosts it names the CA for the common TLS stacks:
// SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE and GIT_SSL_CAINFO
// replace the system roots, so they name the bundle (system roots plus the
// run CA); NODE_EXTRA_CA_CERTS adds to Node's roots, so it names the CA alone.
func (p *Proxy) ContainerEnv(dir string) []string {
	return containerEnv(dir, p.ca != nil)
}

func containerEnv(dir string, withCA bool) []string {
	url := "http://" + RelayAddr
	env := []string{
		SocketEnv + "=" + dir + "/" + SocketName,
		"HTTP_PROXY=" + url, "HTTPS_PROXY=" + url, "http_proxy=" + url, "https_proxy=" + url,
		"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1",
	}
	if withCA {
		bundle, ca := dir+"/"+BundleName, dir+"/"+CAName
		env = append(env,
			"SSL_CERT_FILE="+bundle, "REQUESTS_CA_BUNDLE="+bundle, "CURL_CA_BUNDLE="+bundle,
			"GIT_SSL_CAINFO="+bundle, "PIP_CERT="+bundle, "NPM_CONFIG_CAFILE="+bundle,
			"NODE_EXTRA_CA_CERTS="+ca,
		)
	}
	return env
}

// Close stops serving, ends open tunnels, removes the socket and the CA
// files. After Close, Summary and Err are final. It is safe to call more
// than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil {
		p.srv.Close()
	}
	p.tunnels.Wait()
	p.transport.CloseIdleConnections()
	var errs []error
	if err := <-p.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		errs = append(errs, fmt.Errorf("egress serve: %w", err))
	}
	for _, f := range []string{p.cfg.SocketPath, p.caPath, p.bundlePath} {
		if f == "" {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", f, err))
		}
	}
	s := p.Summary()
	p.log.Info("egress proxy stopped", "connections", s.Connections, "denied", s.Denied, "bytes_up", s.BytesUp, "bytes_down", s.BytesDown)
	if err := p.rec.writeErr(); err != nil {
		errs = append(errs, fmt.Errorf("write egress record: %w", err))
	}
	return errors.Join(errs...)
}

// track registers a hijacked connection so Close can end it; it returns
// false when the proxy is closing.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	p.tunnels.Add(1)
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	p.tunnels.Done()
}
