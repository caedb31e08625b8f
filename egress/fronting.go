package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// maxClientHello bounds what the proxy reads of a tunnel's first TLS flight
// to find its server name: a ClientHello, post-quantum key shares included,
// is a few KiB.
const maxClientHello = 64 << 10

// clientHelloTimeout bounds reading a ClientHello once its first byte came.
const clientHelloTimeout = 10 * time.Second

// tlsHandshakeRecord is the first byte of a TLS handshake record.
const tlsHandshakeRecord = 0x16

// errHelloRead ends the ClientHello parse once the server name is known.
var errHelloRead = errors.New("egress: client hello read")

// errHelloTooLarge is returned by helloReader past maxClientHello bytes.
var errHelloTooLarge = fmt.Errorf("the TLS ClientHello is over %d bytes", maxClientHello)

// checkFirstFlight reads what the agent sends first through a tunnel to
// t.host and returns a reader that replays it followed by the rest of
// client. When the first flight is a TLS ClientHello, its server name
// (SNI) must be empty or t.host: a tunnel to an allowed host of a CDN
// whose SNI names another host would reach that host (domain fronting by
// SNI, or an encrypted ClientHello whose outer name is the CDN's). What
// the first flight is not TLS is passed on unread: the upstream may speak
// first (SSH, SMTP), so nothing else is awaited.
//
// It waits for the agent's first byte without a deadline, as an idle
// tunnel does; Close ends the wait by closing client.
func checkFirstFlight(client net.Conn, t target) (io.Reader, *denial) {
	first := make([]byte, 1)
	n, err := client.Read(first)
	if n == 0 {
		if err == nil {
			err = io.ErrNoProgress
		}
		return errReader{err}, nil
	}
	if first[0] != tlsHandshakeRecord {
		return io.MultiReader(bytes.NewReader(first), client), nil
	}
	_ = client.SetReadDeadline(time.Now().Add(clientHelloTimeout))
	defer client.SetReadDeadline(time.Time{}) //nolint:errcheck // the tunnel ends anyway if it fails
	r := &helloReader{src: io.MultiReader(bytes.NewReader(first), client)}
	name, err := serverName(r)
	if err != nil {
		return nil, &denial{reason: fmt.Sprintf("cannot read the TLS ClientHello sent through the tunnel to %s: %v", t.hostPort(), err)}
	}
	if name != "" && !strings.EqualFold(strings.TrimSuffix(name, "."), t.host) {
		return nil, &denial{
			reason: fmt.Sprintf("the TLS server name %q differs from the CONNECT host %s (domain fronting)", name, t.host),
			fix:    "connect to the host the server name names; an operator allows it with --allow " + net.JoinHostPort(name, fmt.Sprint(t.port)),
		}
	}
	return io.MultiReader(bytes.NewReader(r.read.Bytes()), client), nil
}

// serverName parses the TLS ClientHello that r yields and returns its
// server name, without answering it: crypto/tls parses, and the
// handshake stops at the first callback.
func serverName(r io.Reader) (string, error) {
	var name string
	err := tls.Server(helloConn{r: r}, &tls.Config{
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			name = hello.ServerName
			return nil, errHelloRead
		},
	}).Handshake()
	switch {
	case errors.Is(err, errHelloRead):
		return name, nil
	case err == nil:
		return "", errors.New("the handshake did not stop at the ClientHello")
	default:
		return "", err
	}
}

// helloReader keeps every byte it reads, up to maxClientHello.
type helloReader struct {
	src  io.Reader
	read bytes.Buffer
}

func (h *helloReader) Read(b []byte) (int, error) {
	room := maxClientHello - h.read.Len()
	if room <= 0 {
		return 0, errHelloTooLarge
	}
	if len(b) > room {
		b = b[:room]
	}
	n, err := h.src.Read(b)
	h.read.Write(b[:n])
	return n, err
}

// helloConn is the net.Conn the ClientHello parse reads: it reads r and
// discards what the TLS server would write (its alert), so the agent
// sees nothing of the parse.
type helloConn struct {
	net.Conn // nil: only the methods below are called
	r        io.Reader
}

func (c helloConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c helloConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c helloConn) Close() error                     { return nil }
func (c helloConn) SetDeadline(time.Time) error      { return nil }
func (c helloConn) SetReadDeadline(time.Time) error  { return nil }
func (c helloConn) SetWriteDeadline(time.Time) error { return nil }
func (c helloConn) LocalAddr() net.Addr              { return &net.UnixAddr{Name: "egress", Net: "unix"} }
func (c helloConn) RemoteAddr() net.Addr             { return &net.UnixAddr{Name: "agent", Net: "unix"} }

// errReader is a reader that fails with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
