// Package gateway is the per-run model gateway that runs in the executor.
//
// An untrusted agent never holds the model API key and its container keeps
// network mode none. Instead the executor starts a Gateway that listens on a
// unix socket inside the run directory (bind-mounted into the container). The
// gateway serves an OpenAI-compatible API (POST /v1/chat/completions, streamed
// or not, and GET /v1/models), forwards each request to the configured
// upstream with the key injected host-side, meters tokens from the upstream's
// usage reports, enforces the run's budgets and appends every exchange to a
// JSONL trace with the key redacted.
//
// Socket access: the socket's directory is created 0755 and owned by the
// executor, so the container cannot remove or replace the socket. When the
// executor runs as root the socket is chowned to Config.AgentUID and made
// 0600; otherwise (a non-root executor cannot chown) it is made 0777, which
// lets any local user who can traverse the run directory connect: keep run
// directories 0700-traversable only by the executor and the agent's uid.
//
// Limits: the gateway serves at most a few connections at once, bounds how
// long a client may take to send its request, and runs one exchange at a
// time, so a run's budget cannot be overshot by parallel requests and its
// memory stays bounded; a concurrent request waits for its turn. With a
// token budget, the completion limits sent upstream are clamped to what is
// left of it. An exchange is metered even when the agent hangs up mid-way,
// and one whose upstream reports no usage is charged an estimate.
//
// Finishing a run: call Close first, then read Usage and Err. Close waits for
// the exchange in flight (for up to Config.CloseGrace, then cancels it), so
// only after it returns are Usage and Err final.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/netutil"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/internal/unixsock"
)

// DefaultAgentUID is the uid the agent runs as inside the container.
const DefaultAgentUID = 10001

// ErrBudgetExceeded is wrapped by the error Err returns after the run spent
// its token or request budget.
var ErrBudgetExceeded = errors.New("model budget exceeded")

// ErrBadConfig is wrapped by Start's errors for an unusable Config.
var ErrBadConfig = errors.New("invalid gateway configuration")

// Config configures one run's gateway.
type Config struct {
	// SocketPath is the unix socket to listen on, e.g. <runDir>/.gateway/model.sock.
	// Its directory is created if missing.
	SocketPath string
	// Model is the upstream model, its provider, key source and budgets.
	Model config.ModelEntry
	// Trace receives one JSON line per exchange, key redacted; nil disables it.
	Trace io.Writer
	// Logger logs gateway events; nil uses slog.Default().
	Logger *slog.Logger
	// AgentUID owns the socket when the gateway runs as root; 0 means DefaultAgentUID.
	AgentUID int
	// HTTPClient sends upstream requests; nil uses a client with sane timeouts.
	// Ignored by the scripted provider.
	HTTPClient *http.Client
	// RequestTimeout bounds one upstream exchange, and how long a request
	// waits for the one in flight; 0 means 10 minutes.
	RequestTimeout time.Duration
	// CloseGrace is how long Close lets an exchange in flight finish before
	// cancelling it (and charging an estimate); 0 means 15 seconds.
	CloseGrace time.Duration
}

// Server limits: the agent gets a few connections, and slow clients cannot
// hold them forever.
const (
	maxConnections    = 8
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 2 * time.Minute
)

// Usage is what the run has spent so far.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	Requests         int `json:"requests"`
}

// TotalTokens is prompt plus completion tokens.
func (u Usage) TotalTokens() int { return u.PromptTokens + u.CompletionTokens }

// Gateway is a running per-run model gateway.
type Gateway struct {
	cfg    Config
	log    *slog.Logger
	up     *upstream
	meter  *meter
	trace  *traceWriter
	srv    *http.Server
	served chan error
	// sem holds the one exchange in flight.
	sem chan struct{}
	// waiting counts requests waiting in acquire.
	waiting atomic.Int32
	// closing is closed when Close starts: waiting requests give up.
	closing chan struct{}
	// abortCtx is cancelled when Close stops waiting for the exchange in flight.
	abortCtx context.Context
	abort    context.CancelFunc
	closeMu  sync.Mutex
	closed   bool
	closeErr error
}

// Start validates cfg, prepares the upstream (reading the API key on the host),
// listens on cfg.SocketPath and serves until Close or ctx is cancelled.
//
// The gateway accepts at most a few connections at a time and runs one
// exchange at a time; concurrent requests wait their turn (see
// chatCompletions). To read the final spend, call Close first, then Usage
// and Err: Close waits for the exchange in flight to be metered.
func Start(ctx context.Context, cfg Config) (*Gateway, error) {
	if cfg.SocketPath == "" {
		return nil, fmt.Errorf("%w: SocketPath is empty: set it to <runDir>/.gateway/model.sock", ErrBadConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AgentUID == 0 {
		cfg.AgentUID = DefaultAgentUID
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 10 * time.Minute
	}
	if cfg.CloseGrace == 0 {
		cfg.CloseGrace = 15 * time.Second
	}
	up, err := newUpstream(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := unixsock.Listen(cfg.SocketPath, cfg.AgentUID)
	if err != nil {
		return nil, fmt.Errorf("gateway socket: %w", err)
	}
	g := &Gateway{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "gateway", "socket", cfg.SocketPath),
		up:      up,
		meter:   newMeter(cfg.Model.MaxTokens, cfg.Model.MaxRequests),
		trace:   newTraceWriter(cfg.Trace, up.key),
		served:  make(chan error, 1),
		sem:     make(chan struct{}, 1),
		closing: make(chan struct{}),
	}
	g.abortCtx, g.abort = context.WithCancel(context.Background())
	g.srv = &http.Server{
		Handler:           g.routes(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
	}
	go func() { g.served <- g.srv.Serve(netutil.LimitListener(ln, maxConnections)) }()
	go func() {
		select {
		case <-ctx.Done():
			_ = g.Close()
		case <-g.closing:
		}
	}()
	g.log.Info("model gateway started", "provider", cfg.Model.Provider, "model", up.publicName)
	return g, nil
}

// SocketPath is the socket the gateway listens on.
func (g *Gateway) SocketPath() string { return g.cfg.SocketPath }

// ModelName is the model name the gateway advertises to the agent
// (TASKRUN_MODEL): the upstream model's name, or "scripted".
func (g *Gateway) ModelName() string { return g.up.publicName }

// Usage returns the tokens and requests spent so far; after Close returns
// it is final.
func (g *Gateway) Usage() Usage { return g.meter.usage() }

// Err returns nil while the run is within budget, else an error wrapping
// ErrBudgetExceeded that names the budget; after Close returns it is final.
func (g *Gateway) Err() error { return g.meter.err() }

// errClosing refuses requests that arrive or wait while the gateway closes.
var errClosing = errors.New("model gateway is shutting down")

// acquire waits until no other exchange is in flight and returns the
// function that ends this one.
func (g *Gateway) acquire(ctx context.Context) (func(), error) {
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	timer := time.NewTimer(g.cfg.RequestTimeout)
	defer timer.Stop()
	select {
	case g.sem <- struct{}{}:
	case <-g.closing:
		return nil, errClosing
	case <-ctx.Done():
		return nil, fmt.Errorf("request abandoned while waiting for the one in flight: %w", ctx.Err())
	case <-timer.C:
		return nil, fmt.Errorf("another request was in flight for %s: send one request at a time", g.cfg.RequestTimeout)
	}
	select {
	case <-g.closing:
		<-g.sem
		return nil, errClosing
	default:
		return func() { <-g.sem }, nil
	}
}

// Close stops serving, lets the exchange in flight finish for up to
// Config.CloseGrace (then cancels it, charging an estimate if it reported
// no usage), waits until it is metered and removes the socket. Requests
// still waiting are refused. After Close returns, Usage and Err are final.
// It is safe to call more than once.
func (g *Gateway) Close() error {
	g.closeMu.Lock()
	defer g.closeMu.Unlock()
	if g.closed {
		return g.closeErr
	}
	g.closed = true
	close(g.closing)
	defer g.abort()
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.CloseGrace)
	defer cancel()
	if err := g.srv.Shutdown(ctx); err != nil {
		g.abort()
		g.srv.Close()
	}
	// Take the exchange slot for good: the exchange in flight is metered and no other starts.
	g.sem <- struct{}{}
	if err := <-g.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		g.closeErr = fmt.Errorf("gateway serve: %w", err)
	}
	if err := os.Remove(g.cfg.SocketPath); err != nil && !errors.Is(err, os.ErrNotExist) && g.closeErr == nil {
		g.closeErr = fmt.Errorf("remove gateway socket: %w", err)
	}
	g.log.Info("model gateway stopped", "usage", g.Usage())
	return g.closeErr
}
