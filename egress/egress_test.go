package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/lockedbuf"
)

// canary is a credential value the tests look for everywhere it must not be.
const canary = "canary-7f3c9a-egress-secret"

// mapResolver answers from a fixed table, or from a function per call.
type mapResolver struct {
	mu    sync.Mutex
	hosts map[string][]netip.Addr
	calls map[string]int
	// next, if set, answers instead of hosts (n counts calls for host from 1).
	next func(host string, n int) []netip.Addr
}

func (r *mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls == nil {
		r.calls = map[string]int{}
	}
	r.calls[host]++
	if r.next != nil {
		return r.next(host, r.calls[host]), nil
	}
	if a, ok := r.hosts[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func resolverFor(hosts map[string]string) *mapResolver {
	r := &mapResolver{hosts: map[string][]netip.Addr{}}
	for h, a := range hosts {
		r.hosts[h] = []netip.Addr{netip.MustParseAddr(a)}
	}
	return r
}

// recordingDialer records every address it is asked for and dials only
// loopback ones: any other address is refused without a packet sent.
type recordingDialer struct {
	mu    sync.Mutex
	asked []string
}

func (d *recordingDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.asked = append(d.asked, address)
	d.mu.Unlock()
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, fmt.Errorf("test dialer: %q is not an IP:port", address)
	}
	if !ap.Addr().IsLoopback() {
		return nil, errors.New("test dialer: not dialing a non-loopback address")
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, address)
}

func (d *recordingDialer) addresses() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.asked...)
}

// harness is a started proxy with its record, log and dialer.
type harness struct {
	p      *Proxy
	sock   string
	record *lockedbuf.Buffer
	log    *lockedbuf.Buffer
	dialer *recordingDialer
}

func startProxy(t testing.TB, pol Policy, res Resolver, mod func(*Config)) *harness {
	t.Helper()
	h := &harness{record: &lockedbuf.Buffer{}, log: &lockedbuf.Buffer{}, dialer: &recordingDialer{}}
	dir := t.TempDir()
	h.sock = filepath.Join(dir, ".gateway", SocketName)
	cfg := Config{
		SocketPath: h.sock,
		Policy:     pol,
		Record:     h.record,
		Logger:     slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Resolver:   res,
		Dialer:     h.dialer,
		Getenv:     func(k string) string { return map[string]string{"TEST_CANARY": canary}[k] },
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := Start(context.Background(), cfg)
	require.NoError(t, err)
	h.p = p
	t.Cleanup(func() { _ = p.Close() })
	return h
}

// client is an HTTP client that uses the proxy through its socket and
// trusts roots for TLS.
func (h *harness) client(roots *x509.CertPool) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "egress.invalid"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", h.sock)
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DisableKeepAlives: true,
	}}
}

// entries closes the proxy, so that every entry is written, and parses the record.
func (h *harness) entries(t *testing.T) []Entry {
	t.Helper()
	require.NoError(t, h.p.Close())
	var out []Entry
	for _, line := range strings.Split(strings.TrimSpace(h.record.String()), "\n") {
		if line == "" {
			continue
		}
		var e Entry
		require.NoError(t, json.Unmarshal([]byte(line), &e), line)
		out = append(out, e)
	}
	return out
}

// rawConnect sends a CONNECT over the socket and returns the status line and body.
func (h *harness) rawConnect(t *testing.T, hostport string) (int, string) {
	t.Helper()
	c, err := net.Dial("unix", h.sock)
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, ""
	}
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func portOf(t testing.TB, u string) int {
	t.Helper()
	pu, err := url.Parse(u)
	require.NoError(t, err)
	port, err := strconv.Atoi(pu.Port())
	require.NoError(t, err)
	return port
}

func helloServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s %s host=%s", r.Method, r.URL.Path, r.Host)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestPlainHTTPAllowedHostWorksOthersGetReadable403(t *testing.T) {
	srv := helloServer(t)
	port := portOf(t, srv.URL)
	h := startProxy(t, Policy{Rules: []Rule{{Host: "web.test", Port: port}, {Host: "127.0.0.1", Port: port}}},
		resolverFor(map[string]string{"web.test": "127.0.0.1", "other.test": "127.0.0.1"}), nil)
	c := h.client(nil)

	code, body := get(t, c, fmt.Sprintf("http://web.test:%d/hello", port))
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, fmt.Sprintf("hello GET /hello host=web.test:%d", port), body)

	code, body = get(t, c, fmt.Sprintf("http://other.test:%d/x", port))
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, fmt.Sprintf("denied GET other.test:%d/x", port))
	assert.Contains(t, body, fmt.Sprintf("no rule allows other.test:%d", port))
	assert.Contains(t, body, fmt.Sprintf("--allow other.test:%d", port))

	// The plain port 80 of an allowed name is not the allowed port.
	code, body = get(t, c, "http://web.test/")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "no rule allows web.test:80")

	got := h.entries(t)
	require.Len(t, got, 3)
	// An allowed request is recorded once its response has been relayed,
	// which on a loaded machine can come after the next request's denial:
	// the test pins the records, not their order.
	slices.SortStableFunc(got, func(a, b Entry) int {
		if (a.Decision == DecisionAllow) != (b.Decision == DecisionAllow) {
			if a.Decision == DecisionAllow {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Host, b.Host)
	})
	assert.Equal(t, DecisionAllow, got[0].Decision)
	assert.Equal(t, "web.test", got[0].Host)
	assert.Equal(t, "/hello", got[0].Path)
	assert.Equal(t, "127.0.0.1", got[0].Address)
	assert.Equal(t, fmt.Sprintf("web.test:%d", port), got[0].Rule)
	assert.Equal(t, http.StatusOK, got[0].Status)
	assert.Positive(t, got[0].BytesUp)
	assert.Positive(t, got[0].BytesDown)
	assert.Equal(t, DecisionDeny, got[1].Decision)
	assert.Equal(t, "other.test", got[1].Host)
	assert.Empty(t, got[1].Rule)
	assert.Equal(t, []string{"127.0.0.1:" + strconv.Itoa(port)}, h.dialer.addresses(), "only the allowed request was dialed")
	sum := h.p.Summary()
	assert.Equal(t, 3, sum.Connections)
	assert.Equal(t, 1, sum.Allowed)
	assert.Equal(t, []string{"other.test", "web.test"}, sum.DeniedHosts)
}

func TestConnectRefusedWithReadableBody(t *testing.T) {
	h := startProxy(t, Policy{Rules: []Rule{{Host: "api.example.test", Port: 443}}}, resolverFor(nil), nil)
	code, body := h.rawConnect(t, "evil.test:443")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "denied CONNECT evil.test:443")
	assert.Contains(t, body, "no rule allows evil.test:443")
	assert.Contains(t, body, "--allow evil.test:443")
	// A name the rule's suffix does not cover, and junk host names.
	code, body = h.rawConnect(t, "api.example.test.evil.test:443")
	assert.Equal(t, http.StatusForbidden, code, body)
	code, body = h.rawConnect(t, "bad_host!:443")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "not a valid host name")
	assert.Empty(t, h.dialer.addresses())
}

func TestLoopbackOtherThanTheNamedOneIsRefused(t *testing.T) {
	srv := helloServer(t)
	port := portOf(t, srv.URL)
	h := startProxy(t, Policy{Rules: []Rule{{Host: "web.test", Port: port}, {Host: "127.0.0.1", Port: port}}},
		resolverFor(map[string]string{"web.test": "127.0.0.2", "six.test": "::1"}), nil)
	c := h.client(nil)
	code, body := get(t, c, fmt.Sprintf("http://web.test:%d/", port))
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "web.test resolves to 127.0.0.2 (loopback)")
	assert.Contains(t, body, fmt.Sprintf("--allow 127.0.0.2:%d", port))
	// A literal loopback address no rule names is refused the same way.
	code, body = get(t, c, fmt.Sprintf("http://127.0.0.3:%d/", port))
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, fmt.Sprintf("no rule allows 127.0.0.3:%d", port))
	assert.Empty(t, h.dialer.addresses(), "nothing was dialed")
}

func TestSpecialRangesAreRefusedUnlessARuleNamesTheAddress(t *testing.T) {
	refused := map[string]string{
		"10.1.2.3":               "private",
		"172.16.0.9":             "private",
		"192.168.1.1":            "private",
		"fd12::1":                "private",
		"169.254.169.254":        "cloud metadata",
		"169.254.170.2":          "cloud metadata",
		"fd00:ec2::254":          "cloud metadata",
		"169.254.10.10":          "link-local",
		"fe80::1":                "link-local",
		"100.64.1.1":             "carrier-grade NAT",
		"224.0.0.251":            "multicast",
		"ff02::1":                "multicast",
		"0.0.0.0":                "unspecified",
		"::":                     "unspecified",
		"127.0.0.1":              "loopback",
		"::ffff:10.0.0.1":        "private",
		"::ffff:169.254.169.254": "cloud metadata",
		"64:ff9b::a00:1":         "NAT64",
		"2002:a00:1::1":          "6to4",
	}
	for addr, class := range refused {
		t.Run(addr, func(t *testing.T) {
			res := resolverFor(map[string]string{"x.test": addr})
			h := startProxy(t, Policy{Rules: []Rule{{Host: "x.test", Port: 443}, {Host: "x.test", Port: 80}}}, res, nil)
			code, body := h.rawConnect(t, "x.test:443")
			assert.Equal(t, http.StatusForbidden, code)
			assert.Contains(t, body, "("+class+")")
			code, body = get(t, h.client(nil), "http://x.test/latest/meta-data/")
			assert.Equal(t, http.StatusForbidden, code)
			assert.Contains(t, body, "("+class+")")
			assert.Empty(t, h.dialer.addresses(), "the proxy asked for no connection")
		})
	}

	// A public address, and a metadata address a rule names, reach the
	// dialer with exactly the checked address (the test dialer refuses to
	// send anything to them).
	res := resolverFor(map[string]string{"public.test": "93.184.216.34"})
	h := startProxy(t, Policy{Rules: []Rule{{Host: "public.test", Port: 443}, {Host: "169.254.169.254", Port: 80}}}, res, nil)
	code, body := h.rawConnect(t, "public.test:443")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "cannot connect to 93.184.216.34:443")
	code, _ = get(t, h.client(nil), "http://169.254.169.254/latest/meta-data/")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, []string{"93.184.216.34:443", "169.254.169.254:80"}, h.dialer.addresses())
}

func TestRebindingResolverCannotReachTheRefusedAddress(t *testing.T) {
	srv := helloServer(t)
	port := portOf(t, srv.URL)
	allowed := netip.MustParseAddr("127.0.0.1")
	refused := netip.MustParseAddr("127.0.0.2")
	res := &mapResolver{next: func(host string, n int) []netip.Addr {
		switch {
		case host == "mixed.test":
			return []netip.Addr{refused, allowed}
		case n == 1:
			return []netip.Addr{allowed}
		default:
			return []netip.Addr{refused}
		}
	}}
	h := startProxy(t, Policy{Rules: []Rule{{Host: "*.test", Port: port}, {Host: "127.0.0.1", Port: port}}}, res, nil)
	c := h.client(nil)
	target := fmt.Sprintf("rebind.test:%d", port)
	code, _ := get(t, c, "http://"+target+"/one")
	assert.Equal(t, http.StatusOK, code)
	code, body := get(t, c, "http://"+target+"/two")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "127.0.0.2 (loopback)")
	code, _ = h.rawConnect(t, target)
	assert.Equal(t, http.StatusForbidden, code)
	// An answer holding both: the proxy connects to the allowed one only.
	code, _ = get(t, c, fmt.Sprintf("http://mixed.test:%d/", port))
	assert.Equal(t, http.StatusOK, code)
	want := "127.0.0.1:" + strconv.Itoa(port)
	assert.Equal(t, []string{want, want}, h.dialer.addresses())
	assert.Equal(t, 3, res.calls["rebind.test"], "one lookup per connection")
}

// tlsUpstream is an HTTPS server on loopback whose test CA the proxy trusts.
func tlsUpstream(t testing.TB, h http.Handler) (*httptest.Server, *x509.CertPool) {
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return srv, pool
}

func TestHTTPSWithoutCredentialIsTunneledUntouched(t *testing.T) {
	srv, pool := tlsUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls hello %s", r.URL.Path)
	}))
	port := portOf(t, srv.URL)
	// httptest's certificate names example.com.
	h := startProxy(t, Policy{Rules: []Rule{{Host: "example.com", Port: port}, {Host: "127.0.0.1", Port: port}}},
		resolverFor(map[string]string{"example.com": "127.0.0.1"}), nil)
	assert.Empty(t, h.p.CAPath(), "nothing to intercept, no CA")
	resp, err := h.client(pool).Get(fmt.Sprintf("https://example.com:%d/tunnel", port))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "tls hello /tunnel", string(body))
	assert.True(t, resp.TLS.PeerCertificates[0].Equal(srv.Certificate()), "the client saw the upstream's own certificate")
	require.NoError(t, h.p.Close(), "Close waits for the tunnel's record")
	got := h.entries(t)
	require.Len(t, got, 1)
	assert.Equal(t, "connect", got[0].Kind)
	assert.Empty(t, got[0].Method, "a tunnel is not inspected")
	assert.Positive(t, got[0].BytesUp)
	assert.Positive(t, got[0].BytesDown)
}

func TestCredentialIsInjectedOnTheHostAndNeverShown(t *testing.T) {
	seen := make(chan http.Header, 4)
	srv, pool := tlsUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		fmt.Fprintf(w, "api %s %s host=%s", r.Method, r.URL.Path, r.Host)
	}))
	port := portOf(t, srv.URL)
	pol := Policy{
		Rules:       []Rule{{Host: "example.com", Port: port}, {Host: "127.0.0.1", Port: port}},
		Credentials: []Credential{{Host: "example.com", Header: "Authorization", ValueEnv: "TEST_CANARY", Format: "Bearer %s"}},
	}
	h := startProxy(t, pol, resolverFor(map[string]string{"example.com": "127.0.0.1"}), func(c *Config) { c.UpstreamRoots = pool })
	require.FileExists(t, h.p.CAPath())
	caPEM, err := os.ReadFile(h.p.CAPath())
	require.NoError(t, err)
	runRoots := x509.NewCertPool()
	require.True(t, runRoots.AppendCertsFromPEM(caPEM))

	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("https://example.com:%d/user", port), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer forged-by-agent")
	req.Host = "evil.test" // the CONNECT host, not the Host header, names the upstream
	resp, err := h.client(runRoots).Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, fmt.Sprintf("api GET /user host=example.com:%d", port), string(body))
	assert.Equal(t, "Bearer "+canary, (<-seen).Get("Authorization"), "the upstream got the brokered credential")
	assert.Equal(t, "taskrun egress run CA", resp.TLS.PeerCertificates[0].Issuer.CommonName)
	for k, vs := range resp.Header {
		assert.NotContains(t, k+strings.Join(vs, ","), canary)
	}

	require.NoError(t, h.p.Close())
	got := h.entries(t)
	require.Len(t, got, 1)
	assert.Equal(t, "https", got[0].Kind)
	assert.Equal(t, "GET", got[0].Method)
	assert.Equal(t, "/user", got[0].Path)
	assert.Equal(t, "Authorization", got[0].Credential)
	assert.NotContains(t, h.record.String(), canary)
	assert.NotContains(t, h.log.String(), canary)
	assertNoFileContains(t, filepath.Dir(filepath.Dir(h.sock)), canary)

	// The CA cannot vouch for a host it does not intercept.
	ca := h.p.ca
	leaf, err := ca.leaf("github.com")
	require.NoError(t, err)
	_, err = leaf.Leaf.Verify(x509.VerifyOptions{Roots: runRoots, DNSName: "github.com"})
	require.Error(t, err, "name constraints limit the run CA to intercepted hosts")
}

func TestMethodAndPathRulesAreEnforcedInsideTLS(t *testing.T) {
	srv, pool := tlsUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ok %s %s", r.Method, r.URL.Path)
	}))
	port := portOf(t, srv.URL)
	pol := Policy{Rules: []Rule{{Host: "example.com", Port: port, Methods: []string{"GET"}, Paths: []string{"/repos/"}}, {Host: "127.0.0.1", Port: port}}}
	h := startProxy(t, pol, resolverFor(map[string]string{"example.com": "127.0.0.1"}), func(c *Config) { c.UpstreamRoots = pool })
	caPEM, err := os.ReadFile(h.p.CAPath())
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	c := h.client(roots)
	base := fmt.Sprintf("https://example.com:%d", port)

	code, body := get(t, c, base+"/repos/a/b")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok GET /repos/a/b", body)
	for _, path := range []string{"/admin", "/repos/../admin", "/repos//x/../../admin"} {
		code, body = get(t, c, base+path)
		assert.Equal(t, http.StatusForbidden, code, path)
		assert.Contains(t, body, "does not allow GET", path)
	}
	resp, err := c.Post(base+"/repos/a", "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	body2, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, string(body2), "does not allow POST /repos/a")
	assert.Contains(t, string(body2), "--egress-policy")
}

func TestByteBudgetStopsTraffic(t *testing.T) {
	big := strings.Repeat("x", 256<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, big)
	}))
	t.Cleanup(srv.Close)
	port := portOf(t, srv.URL)
	h := startProxy(t, Policy{Rules: []Rule{{Host: "127.0.0.1", Port: port}}, MaxBytes: 64 << 10}, resolverFor(nil), nil)
	c := h.client(nil)
	resp, err := c.Get(srv.URL)
	if err == nil {
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Less(t, n, int64(64<<10), "the response was cut at the budget")
	}
	require.ErrorIs(t, h.p.Err(), ErrBudgetExceeded)
	code, body := get(t, c, srv.URL)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "byte budget of 65536 bytes is spent")
	assert.Contains(t, body, "max_bytes")
	code, _ = h.rawConnect(t, fmt.Sprintf("127.0.0.1:%d", port))
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, h.p.Summary().BudgetExceeded, "byte budget")
}

func TestByteBudgetEndsAnOpenTunnel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }() // echo
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	h := startProxy(t, Policy{Rules: []Rule{{Host: "127.0.0.1", Port: port}}, MaxBytes: 10000}, resolverFor(nil), nil)
	c, err := net.Dial("unix", h.sock)
	require.NoError(t, err)
	defer c.Close()
	fmt.Fprintf(c, "CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n", port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	go func() {
		chunk := make([]byte, 1000)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	n, _ := io.Copy(io.Discard, br)
	assert.LessOrEqual(t, n, int64(10000), "echoed bytes stay within the budget")
	require.ErrorIs(t, h.p.Err(), ErrBudgetExceeded)
	require.NoError(t, h.p.Close())
	got := h.entries(t)
	require.Len(t, got, 1)
	assert.LessOrEqual(t, got[0].BytesUp+got[0].BytesDown, int64(10000))
	assert.Contains(t, got[0].Reason, "byte budget")
}

func TestConnectionBudgetStopsTraffic(t *testing.T) {
	srv := helloServer(t)
	port := portOf(t, srv.URL)
	h := startProxy(t, Policy{Rules: []Rule{{Host: "127.0.0.1", Port: port}}, MaxConnections: 2}, resolverFor(nil), nil)
	c := h.client(nil)
	for i := 0; i < 2; i++ {
		code, _ := get(t, c, srv.URL)
		assert.Equal(t, http.StatusOK, code)
	}
	code, body := get(t, c, srv.URL)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "connection budget of 2 is spent")
	assert.Contains(t, body, "max_connections")
	require.ErrorIs(t, h.p.Err(), ErrBudgetExceeded)
	assert.Len(t, h.dialer.addresses(), 2)
}

func TestContainerEnvAndFiles(t *testing.T) {
	srv, pool := tlsUpstream(t, http.NotFoundHandler())
	port := portOf(t, srv.URL)
	pol := Policy{
		Rules:       []Rule{{Host: "example.com", Port: port}},
		Credentials: []Credential{{Host: "example.com", Header: "X-Token", ValueEnv: "TEST_CANARY"}},
	}
	h := startProxy(t, pol, resolverFor(nil), func(c *Config) { c.UpstreamRoots = pool })
	env := strings.Join(h.p.ContainerEnv("/taskrun/.gateway"), "\n")
	for _, want := range []string{
		"HTTP_PROXY=http://127.0.0.1:8412", "https_proxy=http://127.0.0.1:8412", "NO_PROXY=localhost,127.0.0.1,::1",
		"TASKRUN_EGRESS_SOCKET=/taskrun/.gateway/egress.sock",
		"SSL_CERT_FILE=/taskrun/.gateway/egress-ca-bundle.pem", "GIT_SSL_CAINFO=/taskrun/.gateway/egress-ca-bundle.pem",
		"NODE_EXTRA_CA_CERTS=/taskrun/.gateway/egress-ca.pem",
	} {
		assert.Contains(t, env, want)
	}
	assert.NotContains(t, env, canary)
	bundle, err := os.ReadFile(h.p.BundlePath())
	require.NoError(t, err)
	caPEM, err := os.ReadFile(h.p.CAPath())
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(bundle), string(caPEM)), "the bundle ends with the run CA")
	require.NoError(t, h.p.Close())
	assert.NoFileExists(t, h.sock)
	assert.NoFileExists(t, h.p.CAPath())
}

func TestStartRefusesUnusableConfig(t *testing.T) {
	_, err := Start(context.Background(), Config{SocketPath: filepath.Join(t.TempDir(), "e.sock")})
	require.ErrorIs(t, err, ErrBadConfig)
	_, err = Start(context.Background(), Config{
		SocketPath: filepath.Join(t.TempDir(), "e.sock"),
		Policy: Policy{Rules: []Rule{{Host: "api.github.com"}},
			Credentials: []Credential{{Host: "api.github.com", Header: "Authorization", ValueEnv: "TASKRUN_TEST_UNSET_VAR"}}},
		Getenv: func(string) string { return "" },
	})
	require.ErrorIs(t, err, ErrBadPolicy)
	assert.Contains(t, err.Error(), "TASKRUN_TEST_UNSET_VAR is empty or unset")
}

// assertNoFileContains fails if any regular file under dir holds secret.
func assertNoFileContains(t *testing.T, dir, secret string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		assert.NotContains(t, string(data), secret, path)
		return err
	}))
}

func TestInterceptedRequestHeaderIsBounded(t *testing.T) {
	srv, pool := tlsUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	port := portOf(t, srv.URL)
	pol := Policy{Rules: []Rule{{Host: "example.com", Port: port, Methods: []string{"GET"}}, {Host: "127.0.0.1", Port: port}}}
	h := startProxy(t, pol, resolverFor(map[string]string{"example.com": "127.0.0.1"}), func(c *Config) { c.UpstreamRoots = pool })
	caPEM, err := os.ReadFile(h.p.CAPath())
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)

	c, err := net.Dial("unix", h.sock)
	require.NoError(t, err)
	defer c.Close()
	fmt.Fprintf(c, "CONNECT example.com:%d HTTP/1.1\r\nHost: x\r\n\r\n", port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: "example.com"})
	require.NoError(t, tc.Handshake())
	// An endless header line: the proxy stops reading at its header limit.
	_, err = io.WriteString(tc, "GET / HTTP/1.1\r\nHost: example.com\r\nX-Long: ")
	require.NoError(t, err)
	chunk := []byte(strings.Repeat("a", 64<<10))
	var sent int
	for sent = 0; sent < 16<<20; sent += len(chunk) {
		if _, err := tc.Write(chunk); err != nil {
			break
		}
	}
	assert.Less(t, sent, 16<<20, "the proxy closed the tunnel instead of buffering the header")
	assert.Empty(t, h.dialer.addresses(), "nothing went upstream")
}

func TestInterceptedHandshakeFailureIsRecorded(t *testing.T) {
	srv, pool := tlsUpstream(t, http.NotFoundHandler())
	port := portOf(t, srv.URL)
	pol := Policy{
		Rules:       []Rule{{Host: "example.com", Port: port}},
		Credentials: []Credential{{Host: "example.com", Header: "X-Token", ValueEnv: "TEST_CANARY"}},
	}
	h := startProxy(t, pol, resolverFor(map[string]string{"example.com": "127.0.0.1"}), func(c *Config) { c.UpstreamRoots = pool })
	// A client that trusts only the upstream's CA, not the run's.
	_, err := h.client(pool).Get(fmt.Sprintf("https://example.com:%d/", port))
	require.Error(t, err)
	got := h.entries(t)
	require.Len(t, got, 1)
	assert.Equal(t, "connect", got[0].Kind)
	assert.Contains(t, got[0].Reason, "does it trust egress-ca.pem?")
	assert.Empty(t, h.dialer.addresses(), "nothing went upstream")
}

func TestCredentialIsNeverSentInClear(t *testing.T) {
	seen := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Authorization")
	}))
	t.Cleanup(srv.Close)
	port := portOf(t, srv.URL)
	pol := Policy{
		Rules:       []Rule{{Host: "api.test", Port: port}, {Host: "127.0.0.1", Port: port}},
		Credentials: []Credential{{Host: "api.test", Header: "Authorization", ValueEnv: "TEST_CANARY"}},
	}
	h := startProxy(t, pol, resolverFor(map[string]string{"api.test": "127.0.0.1"}), nil)
	code, _ := get(t, h.client(nil), fmt.Sprintf("http://api.test:%d/", port))
	assert.Equal(t, http.StatusOK, code)
	assert.Empty(t, <-seen, "plain HTTP never carries the brokered credential")
	assert.Empty(t, h.entries(t)[0].Credential)
}

// TestAmbiguousPathsNeverReachTheUpstreamWithTheCredential: a path an
// upstream may read as walking out of the allowed prefix ("..;", a second
// encoding, a backslash) is refused before the brokered credential is sent.
func TestAmbiguousPathsNeverReachTheUpstreamWithTheCredential(t *testing.T) {
	var seen []string
	var mu sync.Mutex
	srv, pool := tlsUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.RawPath+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprint(w, "ok")
	}))
	port := portOf(t, srv.URL)
	pol := Policy{Rules: []Rule{{Host: "example.com", Port: port, Paths: []string{"/repos/"}}, {Host: "127.0.0.1", Port: port}},
		Credentials: []Credential{{Host: "example.com", Header: "Authorization", ValueEnv: "TOKEN"}}}
	h := startProxy(t, pol, resolverFor(map[string]string{"example.com": "127.0.0.1"}), func(c *Config) {
		c.UpstreamRoots = pool
		c.Getenv = func(string) string { return "secret-token" }
	})
	caPEM, err := os.ReadFile(h.p.CAPath())
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	c := h.client(roots)
	base := fmt.Sprintf("https://example.com:%d", port)
	for _, path := range []string{"/repos/..;/admin", "/repos/..;x=1/admin", "/repos/%252e%252e/admin", "/repos/%2e%2e%5cadmin", "/repos/..%5cadmin", "/repos/a%00b"} {
		code, body := get(t, c, base+path)
		assert.Equal(t, http.StatusForbidden, code, path)
		assert.Contains(t, body, "does not allow GET", path)
	}
	mu.Lock()
	assert.Empty(t, seen, "no ambiguous path reached the upstream")
	mu.Unlock()
	code, body := get(t, c, base+"/repos/a;b/c.d/..x")
	assert.Equal(t, http.StatusOK, code, body)
	mu.Lock()
	require.Len(t, seen, 1)
	assert.Contains(t, seen[0], "secret-token", "a plain path is brokered as before")
	mu.Unlock()
}

// readSignalDialer dials like recordingDialer and reports, on reading, the
// index of every connection that starts a Read upstream.
type readSignalDialer struct {
	recordingDialer
	mu      sync.Mutex
	n       int
	reading chan int
}

func (d *readSignalDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := d.recordingDialer.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	i := d.n
	d.n++
	d.mu.Unlock()
	return &readSignalConn{Conn: c, i: i, reading: d.reading}, nil
}

type readSignalConn struct {
	net.Conn
	i       int
	reading chan int
}

func (c *readSignalConn) Read(b []byte) (int, error) {
	select {
	case c.reading <- c.i:
	default:
	}
	return c.Conn.Read(b)
}

func (c *readSignalConn) CloseWrite() error { return c.Conn.(*net.TCPConn).CloseWrite() }

// echoServer echoes every connection on loopback and returns its port.
func echoServer(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// openTunnel sends a CONNECT over the socket and returns the open tunnel.
func (h *harness) openTunnel(t *testing.T, hostport string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", h.sock)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return c, br
}

func TestIdleTunnelSpendsNoBytes(t *testing.T) {
	port := echoServer(t)
	d := &readSignalDialer{reading: make(chan int, 64)}
	h := startProxy(t, Policy{Rules: []Rule{{Host: "127.0.0.1", Port: port}}, MaxBytes: 10000}, resolverFor(nil),
		func(c *Config) { c.Dialer = d })
	target := fmt.Sprintf("127.0.0.1:%d", port)

	// The first tunnel sends nothing: the proxy waits on its upstream.
	idle, _ := h.openTunnel(t, target)
	for i := range d.reading {
		if i == 0 {
			break
		}
	}
	// The second moves bytes that fit the budget while the first waits.
	busy, br := h.openTunnel(t, target)
	msg := strings.Repeat("b", 1000)
	_, err := io.WriteString(busy, msg)
	require.NoError(t, err)
	echo := make([]byte, len(msg))
	_, err = io.ReadFull(br, echo)
	require.NoError(t, err, "the waiting tunnel must not hold the budget")
	assert.Equal(t, msg, string(echo))
	require.NoError(t, h.p.Err())

	busy.Close()
	idle.Close()
	got := h.entries(t)
	require.Len(t, got, 2)
	var total int64
	for _, e := range got {
		assert.Empty(t, e.Reason)
		total += e.BytesUp + e.BytesDown
	}
	assert.Equal(t, int64(2*len(msg)), total, "only the bytes moved are charged")
	assert.Empty(t, h.p.Summary().BudgetExceeded)
}
