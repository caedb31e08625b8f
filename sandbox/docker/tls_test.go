package docker

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
)

// dockerSocket is the local engine the TLS proxy forwards to.
const dockerSocket = "/var/run/docker.sock"

// pki is a throwaway CA with a server and a client certificate.
type pki struct {
	caPEM        []byte
	server       tls.Certificate
	clientCert   []byte
	clientKeyPEM []byte
}

// newPKI issues a CA, a server certificate for 127.0.0.1 and a client certificate.
func newPKI(t *testing.T) pki {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "taskrun test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	issue := func(serial int64, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: "taskrun test"},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		require.NoError(t, err)
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		require.NoError(t, err)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	}
	srvCert, srvKey := issue(2, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	server, err := tls.X509KeyPair(srvCert, srvKey)
	require.NoError(t, err)
	cliCert, cliKey := issue(3, x509.ExtKeyUsageClientAuth, nil)
	return pki{
		caPEM:        pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		server:       server,
		clientCert:   cliCert,
		clientKeyPEM: cliKey,
	}
}

// writeClientDir writes ca.pem, cert.pem and key.pem as DOCKER_CERT_PATH expects.
func (p pki) writeClientDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.pem"), p.caPEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cert.pem"), p.clientCert, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "key.pem"), p.clientKeyPEM, 0o600))
	return dir
}

// startTLSProxy terminates mutual TLS on a loopback port and forwards each
// connection to the local engine's socket. It returns the address and a
// counter of accepted TLS connections.
func startTLSProxy(t *testing.T, p pki) (string, *atomic.Int64) {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(p.caPEM))
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{p.server},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	require.NoError(t, err)
	var accepted atomic.Int64
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { forward(c.(*tls.Conn), &accepted) })
		}
	})
	return ln.Addr().String(), &accepted
}

// forward pipes one TLS connection to the engine socket, passing half-closes
// on so hijacked attach streams end cleanly.
func forward(c *tls.Conn, accepted *atomic.Int64) {
	defer c.Close()
	if err := c.Handshake(); err != nil {
		return
	}
	accepted.Add(1)
	up, err := net.Dial("unix", dockerSocket)
	if err != nil {
		return
	}
	defer up.Close()
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(up, c)
		_ = up.(*net.UnixConn).CloseWrite()
	})
	_, _ = io.Copy(c, up)
	_ = c.CloseWrite()
	wg.Wait()
}

func TestTLSThroughEnvironment(t *testing.T) {
	p := newPKI(t)
	addr, accepted := startTLSProxy(t, p)
	t.Setenv("DOCKER_HOST", "tcp://"+addr)
	t.Setenv("DOCKER_TLS_VERIFY", "1")
	t.Setenv("DOCKER_CERT_PATH", p.writeClientDir(t))

	b, labels := newTestBackend(t)
	var out bytes.Buffer
	spec := sandbox.Spec{Image: testImage, Cmd: []string{"sh", "-c", "echo over tls; printf tail"}, Labels: labels, Timeout: time.Minute}
	h, err := b.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{Stdout: &out})
	require.NoError(t, err)
	res := h.Wait(t.Context())
	require.NoError(t, h.Close(t.Context()))
	require.NoError(t, res.Err)
	require.Equal(t, 0, res.ExitCode)
	require.Equal(t, "over tls\ntail", out.String())
	require.Positive(t, accepted.Load())
}

func TestTLSRejectsUntrustedServer(t *testing.T) {
	served := newPKI(t)
	addr, accepted := startTLSProxy(t, served)
	t.Setenv("DOCKER_HOST", "tcp://"+addr)
	t.Setenv("DOCKER_TLS_VERIFY", "1")
	t.Setenv("DOCKER_CERT_PATH", newPKI(t).writeClientDir(t))

	_, err := New(t.Context())
	require.ErrorIs(t, err, sandbox.ErrDaemonUnavailable)
	var unknownAuthority x509.UnknownAuthorityError
	require.True(t, errors.As(err, &unknownAuthority), "want a certificate verification error, got %v", err)
	require.Zero(t, accepted.Load())
}
