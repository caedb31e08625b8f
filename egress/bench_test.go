package egress

import (
	"bufio"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
)

// BenchmarkTunnelThroughput measures bytes through an untouched CONNECT
// tunnel: client -> unix socket -> proxy -> loopback echo-less sink.
func BenchmarkTunnelThroughput(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	h := startProxy(b, Policy{Rules: []Rule{{Host: "127.0.0.1", Port: port}}, MaxBytes: 1 << 62}, resolverFor(nil), nil)
	c, err := net.Dial("unix", h.sock)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n", port)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("connect: %v %v", err, resp)
	}
	chunk := make([]byte, 1<<20)
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInterceptedRequest measures one HTTPS request through an
// intercepted host with a brokered credential, on a kept-alive tunnel.
func BenchmarkInterceptedRequest(b *testing.B) {
	srv, pool := tlsUpstream(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	port := portOf(b, srv.URL)
	pol := Policy{
		Rules:          []Rule{{Host: "example.com", Port: port}, {Host: "127.0.0.1", Port: port}},
		Credentials:    []Credential{{Host: "example.com", Header: "Authorization", ValueEnv: "TEST_CANARY"}},
		MaxConnections: 1 << 30,
	}
	h := startProxy(b, pol, resolverFor(map[string]string{"example.com": "127.0.0.1"}), func(c *Config) { c.UpstreamRoots = pool })
	caPEM, err := os.ReadFile(h.p.CAPath())
	if err != nil {
		b.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	client := h.client(roots)
	client.Transport.(*http.Transport).DisableKeepAlives = false
	url := fmt.Sprintf("https://example.com:%d/", port)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := client.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
