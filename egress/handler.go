package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// maxRecordedPath bounds the path kept in a record entry.
const maxRecordedPath = 1024

// denial is a refused connection or request: what refused it and how an
// operator would allow it.
type denial struct {
	reason string
	fix    string
}

// ServeHTTP handles CONNECT and absolute-URI plain HTTP requests.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		p.handleConnect(w, r)
	case r.URL.IsAbs() && r.URL.Scheme == "http":
		p.handlePlain(w, r)
	default:
		http.Error(w, "taskrun egress proxy: send plain HTTP as an absolute-URI proxy request (http://host/path) and HTTPS through CONNECT; HTTP_PROXY and HTTPS_PROXY are set for that\n", http.StatusBadRequest)
	}
}

// target is a checked destination.
type target struct {
	host string
	port int
	rule *Rule
}

// parseTarget reads and normalizes host and port.
func parseTarget(host string, port int) (target, *denial) {
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if port < 1 || port > 65535 {
		return target{host: host, port: port}, &denial{reason: fmt.Sprintf("port %d is not a valid port", port)}
	}
	if _, err := netip.ParseAddr(host); err != nil {
		if err := validName(host); err != nil {
			if len(host) > maxHostLen {
				host = host[:maxHostLen]
			}
			return target{host: host, port: port}, &denial{reason: fmt.Sprintf("%q is not a valid host name: %v", host, err)}
		}
	}
	return target{host: host, port: port}, nil
}

// hostPort formats a target the way --allow spells it.
func (t target) hostPort() string {
	return net.JoinHostPort(t.host, strconv.Itoa(t.port))
}

// allowHint is the flag that would allow t.
func (t target) allowHint() string {
	return fmt.Sprintf("run the task with --allow %s (or add {\"host\": %q, \"port\": %d} to the --egress-policy file)", t.hostPort(), t.host, t.port)
}

// matchRules returns the rules allowing t's host and port.
func (p *Proxy) matchRules(t target) []*Rule {
	var out []*Rule
	for i := range p.rules {
		if r := &p.rules[i]; r.matchesHost(t.host) && r.matchesPort(t.port) {
			out = append(out, r)
		}
	}
	return out
}

// intercepted reports whether the proxy must see t's requests in clear.
func (p *Proxy) intercepted(t target, rules []*Rule) bool {
	if len(p.creds[t.host]) > 0 {
		return true
	}
	for _, r := range rules {
		if r.inspects() {
			return true
		}
	}
	return false
}

// allowRequest picks the rule allowing method and path among rules.
func allowRequest(t target, rules []*Rule, method, path string) (*Rule, *denial) {
	for _, r := range rules {
		if r.allowsRequest(method, path) {
			return r, nil
		}
	}
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = "'" + r.String() + "'"
	}
	return nil, &denial{
		reason: fmt.Sprintf("rule %s does not allow %s %s", strings.Join(names, ", "), method, path),
		fix:    fmt.Sprintf("add the method or a path prefix to the rule for %s in the --egress-policy file", t.host),
	}
}

// resolve looks the host up once and returns the first address the policy
// lets the proxy reach: a public address, or one a rule names as an IP
// literal. The caller connects to exactly that address.
func (p *Proxy) resolve(ctx context.Context, t target) (netip.Addr, *denial) {
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(t.host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		lctx, cancel := context.WithTimeout(ctx, dialTimeout)
		defer cancel()
		addrs, err = p.cfg.Resolver.LookupNetIP(lctx, "ip", t.host)
		if err != nil || len(addrs) == 0 {
			return netip.Addr{}, &denial{reason: fmt.Sprintf("%s does not resolve: %v", t.host, err)}
		}
	}
	var refused []string
	for _, a := range addrs {
		a = a.Unmap()
		class := addressClass(a)
		if class == "" || p.namesAddress(a, t.port) {
			return a, nil
		}
		refused = append(refused, fmt.Sprintf("%s (%s)", a, class))
	}
	first := addrs[0].Unmap()
	return netip.Addr{}, &denial{
		reason: fmt.Sprintf("%s resolves to %s: the proxy refuses loopback, private, link-local, CGNAT, multicast, reserved and metadata addresses unless a rule names the address", t.host, strings.Join(refused, ", ")),
		fix:    fmt.Sprintf("only if that address is meant to be reachable, run the task with --allow %s", net.JoinHostPort(first.String(), strconv.Itoa(t.port))),
	}
}

// namesAddress reports whether a rule names a as an IP literal on port.
func (p *Proxy) namesAddress(a netip.Addr, port int) bool {
	for _, r := range p.rules {
		if b, err := netip.ParseAddr(r.Host); err == nil && b.Unmap() == a && r.matchesPort(port) {
			return true
		}
	}
	return false
}

// dial connects to exactly addr, metered against the run's budget.
func (p *Proxy) dial(ctx context.Context, addr netip.Addr, port int) (*meteredConn, error) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	c, err := p.cfg.Dialer.DialContext(dctx, "tcp", netip.AddrPortFrom(addr, uint16(port)).String())
	if err != nil {
		return nil, err
	}
	return &meteredConn{Conn: c, budget: p.budget}, nil
}

// deny answers 403 naming the reason and the fix, and records it. The
// reason is also in the status line and a header, for clients that show
// those but not the body of an error (busybox wget, git).
func (p *Proxy) deny(w http.ResponseWriter, e Entry, d *denial) {
	e.Decision, e.Reason = DecisionDeny, d.reason
	p.rec.add(e)
	body := denialBody(e, d)
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set(DeniedHeader, headerText(d.reason))
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, body)
		return
	}
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(readHeaderTimeout))
	fmt.Fprintf(rw, "HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n%s: %s\r\n\r\n%s",
		deniedStatus(d), len(body), DeniedHeader, headerText(d.reason), body)
	_ = rw.Flush()
}

// deniedStatus is the status line of a denial, its reason phrase naming the cause.
func deniedStatus(d *denial) string {
	return "403 Forbidden by taskrun egress policy: " + headerText(d.reason)
}

// DeniedHeader carries the reason of a 403 for clients that do not show
// the body of an error response (busybox wget -S shows headers).
const DeniedHeader = "X-Taskrun-Egress-Denied"

// headerText makes s safe and short enough for a header value.
func headerText(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r > '~' {
			return ' '
		}
		return r
	}, s)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// denialBody is the text an agent reads when the proxy refuses it.
func denialBody(e Entry, d *denial) string {
	what := e.Method + " "
	if e.Kind == "connect" || e.Method == "" {
		what = "CONNECT "
	}
	what += net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
	if e.Path != "" {
		what += e.Path
	}
	s := "taskrun egress proxy: denied " + what + "\nreason: " + d.reason + "\n"
	if d.fix != "" {
		s += "to allow it, an operator can " + d.fix + "\n"
	}
	return s
}

// entry starts a record entry for t.
func (p *Proxy) entry(kind string, t target) Entry {
	return Entry{Time: p.cfg.Now().UTC(), Kind: kind, Host: t.host, Port: t.port}
}

// admit charges a connection attempt to the budget.
func (p *Proxy) admit() *denial {
	if err := p.budget.admit(); err != nil {
		return &denial{reason: err.Error()}
	}
	return nil
}

// handleConnect tunnels, intercepts or refuses a CONNECT.
func (p *Proxy) handleConnect(w http.ResponseWriter, r *http.Request) {
	host, portText, err := net.SplitHostPort(r.Host)
	port, perr := strconv.Atoi(portText)
	if err != nil || perr != nil {
		port = 0
	}
	t, d := parseTarget(host, port)
	e := p.entry("connect", t)
	if d == nil {
		d = p.admit()
	}
	if d != nil {
		p.deny(w, e, d)
		return
	}
	rules := p.matchRules(t)
	if len(rules) == 0 {
		p.deny(w, e, &denial{reason: "no rule allows " + t.hostPort(), fix: t.allowHint()})
		return
	}
	if p.intercepted(t, rules) {
		p.intercept(w, t, rules)
		return
	}
	t.rule = rules[0]
	e.Rule = t.rule.String()
	addr, d := p.resolve(r.Context(), t)
	if d != nil {
		e.Address = addr.String()
		p.deny(w, e, d)
		return
	}
	e.Address = addr.String()
	up, err := p.dial(r.Context(), addr, t.port)
	if err != nil {
		p.deny(w, e, &denial{reason: fmt.Sprintf("cannot connect to %s: %v", net.JoinHostPort(addr.String(), strconv.Itoa(t.port)), err)})
		return
	}
	client, ok := p.hijack(w)
	if !ok {
		up.Close()
		return
	}
	defer p.untrack(client)
	defer client.Close()
	defer up.Close()
	e.Decision = DecisionAllow
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err == nil {
		if d := pipeBoth(client, up, t); d != nil {
			e.Decision, e.Reason = DecisionDeny, d.reason
			p.log.Warn("egress tunnel refused", "host", t.hostPort(), "reason", d.reason)
		}
	}
	e.BytesUp, e.BytesDown = up.up.Load(), up.down.Load()
	if err := p.budget.err(); err != nil {
		e.Reason = err.Error()
	}
	p.rec.add(e)
}

// hijack takes over the client connection (keeping bytes the server read
// ahead) and registers it with Close.
func (p *Proxy) hijack(w http.ResponseWriter) (net.Conn, bool) {
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		p.log.Warn("hijack failed", "err", err)
		return nil, false
	}
	_ = conn.SetDeadline(time.Time{})
	c := net.Conn(conn)
	if rw.Reader.Buffered() > 0 {
		c = &bufferedConn{Conn: conn, r: rw.Reader}
	}
	if !p.track(c) {
		c.Close()
		return nil, false
	}
	return c, true
}

// bufferedConn reads what the server had buffered before the connection itself.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// pipeBoth copies both ways until each side ends, half-closing as it goes.
// The agent's first flight is checked (checkFirstFlight) before any of it
// goes up; a refused one closes both sides and is returned.
func pipeBoth(client net.Conn, up *meteredConn, t target) *denial {
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(client, up)
		if cw, ok := client.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			client.Close()
		}
		close(done)
	}()
	src, d := checkFirstFlight(client, t)
	if d != nil {
		up.Close()
		client.Close()
		<-done
		return d
	}
	_, err := io.Copy(up, src)
	_ = up.CloseWrite()
	if err != nil {
		// The budget ran out or the client failed: end the other direction too.
		up.Close()
	}
	<-done
	return nil
}

// handlePlain proxies one plain HTTP request.
func (p *Proxy) handlePlain(w http.ResponseWriter, r *http.Request) {
	port := 80
	if ps := r.URL.Port(); ps != "" {
		n, err := strconv.Atoi(ps)
		if err != nil {
			n = 0
		}
		port = n
	}
	t, d := parseTarget(r.URL.Hostname(), port)
	e := p.entry("http", t)
	e.Method, e.Path = r.Method, recordedPath(r.URL)
	if d == nil {
		d = p.admit()
	}
	if d != nil {
		p.deny(w, e, d)
		return
	}
	resp, e, d := p.forward(r.Context(), r, "http", t, e)
	if d != nil {
		p.deny(w, e, d)
		return
	}
	defer resp.Body.Close()
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(flushWriter{w}, resp.Body)
}

// flushWriter flushes after every write so streamed responses pass through.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	_ = http.NewResponseController(f.w).Flush()
	return n, err
}

// recordedPath is the request's path for the record, bounded.
func recordedPath(u interface{ RequestURI() string }) string {
	s := u.RequestURI()
	if len(s) > maxRecordedPath {
		s = s[:maxRecordedPath] + "..."
	}
	return s
}

// targetKey carries the checked address from forward to the transport's dialer.
type targetKey struct{}

// dialPlan is where the transport must connect, and the connection it made.
type dialPlan struct {
	addr netip.Addr
	port int
	conn *meteredConn
}

// newTransport builds the upstream transport: it connects only to the
// address forward checked, one connection per request, and verifies TLS
// against UpstreamRoots.
func (p *Proxy) newTransport() *http.Transport {
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			plan, ok := ctx.Value(targetKey{}).(*dialPlan)
			if !ok || plan.conn != nil {
				return nil, errors.New("egress: connection without a checked address")
			}
			c, err := p.dial(ctx, plan.addr, plan.port)
			if err != nil {
				return nil, err
			}
			plan.conn = c
			return c, nil
		},
		TLSClientConfig:        &tls.Config{RootCAs: p.cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    dialTimeout,
		ResponseHeaderTimeout:  upstreamTimeout,
		DisableKeepAlives:      true,
		DisableCompression:     true,
		ForceAttemptHTTP2:      false,
		MaxResponseHeaderBytes: 1 << 20,
	}
}

// hopHeaders are per-connection headers a proxy does not forward.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append([]string(nil), vs...)
	}
	for _, h := range hopHeaders {
		dst.Del(h)
	}
}

// forward checks one request against the policy and, if allowed, sends it
// upstream (scheme "http" or "https") to the address it checked. It returns
// the response, whose body records the entry when closed, or a denial.
func (p *Proxy) forward(ctx context.Context, in *http.Request, scheme string, t target, e Entry) (*http.Response, Entry, *denial) {
	rules := p.matchRules(t)
	if len(rules) == 0 {
		return nil, e, &denial{reason: "no rule allows " + t.hostPort(), fix: t.allowHint()}
	}
	rule, d := allowRequest(t, rules, in.Method, in.URL.Path)
	if d != nil {
		return nil, e, d
	}
	e.Rule = rule.String()
	addr, d := p.resolve(ctx, t)
	if d != nil {
		return nil, e, d
	}
	e.Address = addr.String()
	out := in.Clone(ctx)
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host = scheme, t.hostPort()
	if (scheme == "http" && t.port == 80) || (scheme == "https" && t.port == 443) {
		out.URL.Host = t.host
		if strings.Contains(t.host, ":") {
			out.URL.Host = "[" + t.host + "]"
		}
	}
	out.Host = ""
	out.Header = http.Header{}
	copyHeader(out.Header, in.Header)
	if scheme == "https" {
		for _, c := range p.creds[t.host] {
			out.Header.Set(c.header, c.value)
			e.Credential = c.header
		}
	}
	plan := &dialPlan{addr: addr, port: t.port}
	out = out.WithContext(context.WithValue(ctx, targetKey{}, plan))
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		reason := "upstream request failed: " + err.Error()
		if berr := p.budget.err(); berr != nil {
			reason = berr.Error()
		}
		d := &denial{reason: reason}
		if untrustedUpstream(err) {
			d.fix = untrustedUpstreamFix(t.host)
		}
		if plan.conn != nil {
			e.BytesUp, e.BytesDown = plan.conn.up.Load(), plan.conn.down.Load()
		}
		return nil, e, d
	}
	e.Decision, e.Status = DecisionAllow, resp.StatusCode
	resp.Body = &recordingBody{ReadCloser: resp.Body, p: p, e: e, conn: plan.conn}
	return resp, e, nil
}

// recordingBody records the entry, with the bytes moved, when the response ends.
type recordingBody struct {
	io.ReadCloser
	p    *Proxy
	e    Entry
	conn *meteredConn
	done bool
}

func (b *recordingBody) Close() error {
	err := b.ReadCloser.Close()
	if !b.done {
		b.done = true
		if b.conn != nil {
			b.e.BytesUp, b.e.BytesDown = b.conn.up.Load(), b.conn.down.Load()
		}
		if berr := b.p.budget.err(); berr != nil {
			b.e.Reason = berr.Error()
		}
		b.p.rec.add(b.e)
	}
	return err
}

// intercept terminates the client's TLS with a run-CA leaf for t.host and
// serves its requests one by one, each checked and forwarded with the
// host's credentials. The CONNECT host, not the SNI or Host header, names
// the upstream.
func (p *Proxy) intercept(w http.ResponseWriter, t target, rules []*Rule) {
	cert, err := p.ca.leaf(t.host)
	if err != nil {
		p.deny(w, p.entry("connect", t), &denial{reason: "cannot issue a certificate: " + err.Error()})
		return
	}
	client, ok := p.hijack(w)
	if !ok {
		return
	}
	defer p.untrack(client)
	defer client.Close()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	tc := tls.Server(client, &tls.Config{
		Certificates: []tls.Certificate{*cert},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	_ = tc.SetDeadline(time.Now().Add(readHeaderTimeout))
	if err := tc.HandshakeContext(p.ctx); err != nil {
		// Most often the client does not trust the run CA: say so in the record.
		e := p.entry("connect", t)
		e.Decision = DecisionAllow
		e.Reason = "intercepted, but the client's TLS handshake failed (does it trust " + CAName + "?): " + err.Error()
		p.rec.add(e)
		return
	}
	lim := &headerLimit{r: tc}
	br := bufio.NewReader(lim)
	for {
		_ = tc.SetReadDeadline(time.Now().Add(idleTimeout))
		lim.left = maxHeaderBytes
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		lim.left = -1
		_ = tc.SetReadDeadline(time.Time{})
		if !p.serveIntercepted(tc, req, t) {
			return
		}
	}
}

// serveIntercepted answers one request read from an intercepted tunnel and
// reports whether the connection may carry another.
func (p *Proxy) serveIntercepted(client net.Conn, req *http.Request, t target) bool {
	e := p.entry("https", t)
	e.Method, e.Path = req.Method, recordedPath(req.URL)
	// The connection can carry another request only if this one's body was read to its end.
	body := &eofTracker{ReadCloser: req.Body}
	if req.Body == http.NoBody {
		body.eof.Store(true)
	} else {
		req.Body = body
	}
	resp, e, d := func() (*http.Response, Entry, *denial) {
		if d := p.admit(); d != nil {
			return nil, e, d
		}
		return p.forward(p.ctx, req, "https", t, e)
	}()
	if d != nil {
		e.Decision, e.Reason = DecisionDeny, d.reason
		p.rec.add(e)
		body := denialBody(e, d)
		resp = &http.Response{
			StatusCode: http.StatusForbidden, Status: deniedStatus(d), ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Content-Type": {"text/plain; charset=utf-8"}, DeniedHeader: {headerText(d.reason)}},
			Body:          io.NopCloser(strings.NewReader(body)),
			ContentLength: int64(len(body)),
			Close:         true,
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, 1<<20))
	}
	defer resp.Body.Close()
	header := http.Header{}
	copyHeader(header, resp.Header)
	resp.Header = header
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	resp.TransferEncoding = nil
	if resp.ContentLength < 0 {
		resp.TransferEncoding = []string{"chunked"}
	}
	// The upstream connection is one per request; the client's may go on.
	resp.Close = resp.Close && d != nil || req.Close
	if err := resp.Write(client); err != nil {
		return false
	}
	_ = resp.Body.Close()
	return !resp.Close && body.eof.Load()
}

// maxHeaderBytes bounds a request's header inside an intercepted tunnel, as
// http.Server's default does outside.
const maxHeaderBytes = http.DefaultMaxHeaderBytes

// headerLimit caps the bytes read while left is not negative, so a request
// header cannot grow without bound; the body is bounded by the byte budget.
type headerLimit struct {
	r    io.Reader
	left int
}

func (l *headerLimit) Read(b []byte) (int, error) {
	if l.left < 0 {
		return l.r.Read(b)
	}
	if l.left == 0 {
		return 0, errors.New("request header too large")
	}
	if len(b) > l.left {
		b = b[:l.left]
	}
	n, err := l.r.Read(b)
	l.left -= n
	return n, err
}

// eofTracker notes when a request body has been read to its end.
type eofTracker struct {
	io.ReadCloser
	eof atomic.Bool
}

func (b *eofTracker) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof.Store(true)
	}
	return n, err
}
