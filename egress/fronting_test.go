package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testdeadline"
)

// countingUpstream is a loopback TCP server that counts the bytes it
// receives and, when greeting is set, speaks first.
type countingUpstream struct {
	port     int
	received atomic.Int64
}

func startCountingUpstream(t *testing.T, greeting string) *countingUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	u := &countingUpstream{port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if greeting != "" {
					if _, err := io.WriteString(c, greeting); err != nil {
						return
					}
				}
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					u.received.Add(int64(n))
					if n > 0 {
						if _, err := c.Write(buf[:n]); err != nil {
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
	return u
}

// A tunnel to an allowed host whose TLS server name names another host is
// closed before a byte of it goes up: behind one CDN address the upstream
// would route by that name. The same tunnel with the allowed host's name
// (in any case) goes through.
//
// Protection: checkFirstFlight in pipeBoth. Without it the ClientHello
// reaches the upstream and the tunnel is recorded as allowed.
func TestTunnelWithAnotherTLSServerNameIsRefused(t *testing.T) {
	up := startCountingUpstream(t, "")
	srv, pool := tlsUpstream(t, nil)
	tlsPort := portOf(t, srv.URL)
	h := startProxy(t, Policy{Rules: []Rule{
		{Host: "cdn.example", Port: up.port}, {Host: "example.com", Port: tlsPort},
		// The names resolve to loopback, which only a rule naming it admits.
		{Host: "127.0.0.1", Port: up.port}, {Host: "127.0.0.1", Port: tlsPort},
	}},
		resolverFor(map[string]string{"cdn.example": "127.0.0.1", "example.com": "127.0.0.1"}), nil)

	c, br := h.openTunnel(t, fmt.Sprintf("cdn.example:%d", up.port))
	fronted := tls.Client(&bufferedConn{Conn: c, r: br}, &tls.Config{ServerName: "other-site.example", InsecureSkipVerify: true}) //nolint:gosec // never reaches a server
	require.Error(t, fronted.Handshake(), "the proxy closes the tunnel")

	c, br = h.openTunnel(t, fmt.Sprintf("example.com:%d", tlsPort))
	same := tls.Client(&bufferedConn{Conn: c, r: br}, &tls.Config{ServerName: "EXAMPLE.com", RootCAs: pool})
	require.NoError(t, same.Handshake(), "the allowed host's own name goes through")
	require.NoError(t, same.Close())

	got := h.entries(t)
	require.Len(t, got, 2)
	byHost := map[string]Entry{got[0].Host: got[0], got[1].Host: got[1]}
	refused := byHost["cdn.example"]
	assert.Equal(t, DecisionDeny, refused.Decision)
	assert.Contains(t, refused.Reason, `TLS server name "other-site.example" differs from the CONNECT host cdn.example`)
	assert.Zero(t, refused.BytesUp, "nothing went up")
	assert.Zero(t, up.received.Load(), "the upstream received nothing")
	assert.Equal(t, DecisionAllow, byHost["example.com"].Decision)
	assert.Positive(t, byHost["example.com"].BytesUp)
}

// A first flight that starts as TLS but is no ClientHello is refused too:
// the proxy cannot tell which host it names.
func TestTunnelWithUnreadableClientHelloIsRefused(t *testing.T) {
	up := startCountingUpstream(t, "")
	h := startProxy(t, Policy{Rules: []Rule{{Host: "127.0.0.1", Port: up.port}}}, resolverFor(nil), nil)
	c, br := h.openTunnel(t, fmt.Sprintf("127.0.0.1:%d", up.port))
	require.NoError(t, c.SetDeadline(time.Now().Add(testdeadline.Scale(10*time.Second))))
	_, err := c.Write([]byte{tlsHandshakeRecord, 3, 1, 0, 5, 'j', 'u', 'n', 'k', '!'})
	require.NoError(t, err)
	_, err = io.ReadAll(br)
	require.NoError(t, err, "the proxy closes the tunnel")

	got := h.entries(t)
	require.Len(t, got, 1)
	assert.Equal(t, DecisionDeny, got[0].Decision)
	assert.Contains(t, got[0].Reason, "cannot read the TLS ClientHello")
	assert.Zero(t, up.received.Load(), "the upstream received nothing")
}

// An upstream that speaks first (SSH, SMTP) is not held up by the check:
// its greeting reaches the agent before the agent sends anything, and
// what is not TLS goes up unchanged.
func TestTunnelToAServerThatSpeaksFirstIsNotHeld(t *testing.T) {
	const greeting = "SSH-2.0-upstream\r\n"
	up := startCountingUpstream(t, greeting)
	h := startProxy(t, Policy{Rules: []Rule{{Host: "127.0.0.1", Port: up.port}}}, resolverFor(nil), nil)
	c, br := h.openTunnel(t, fmt.Sprintf("127.0.0.1:%d", up.port))
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, greeting, line)
	_, err = io.WriteString(c, "SSH-2.0-agent\r\n")
	require.NoError(t, err)
	echo, err := bufio.NewReader(br).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "SSH-2.0-agent\r\n", echo)
	require.NoError(t, c.Close())

	got := h.entries(t)
	require.Len(t, got, 1)
	assert.Equal(t, DecisionAllow, got[0].Decision)
	assert.Equal(t, int64(len("SSH-2.0-agent\r\n")), up.received.Load())
}
