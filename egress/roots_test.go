package egress

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A brokered host served under a private CA (httptest's own) is refused
// with the fix while the proxy trusts only the system roots, and reached,
// with its credential, once the operator's bundle names that CA.
func TestBrokeredHostUnderPrivateCANeedsTheOperatorsBundle(t *testing.T) {
	seen := make(chan string, 4)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Authorization")
		fmt.Fprint(w, "private api")
	}))
	t.Cleanup(srv.Close)
	port := portOf(t, srv.URL)
	pol := Policy{
		Rules:       []Rule{{Host: "example.com", Port: port}, {Host: "127.0.0.1", Port: port}},
		Credentials: []Credential{{Host: "example.com", Header: "Authorization", ValueEnv: "TEST_CANARY", Format: "Bearer %s"}},
	}
	res := resolverFor(map[string]string{"example.com": "127.0.0.1"})
	url := fmt.Sprintf("https://example.com:%d/v1", port)

	// The system roots alone: the upstream's certificate is not trusted.
	h := startProxy(t, pol, res, nil)
	code, body := get(t, h.client(runRoots(t, h)), url)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "certificate signed by unknown authority")
	assert.Contains(t, body, "--egress-ca FILE")
	assert.Empty(t, seen, "nothing reached the upstream")

	// The operator's bundle holds the private CA.
	bundle := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644))
	roots, err := LoadUpstreamRoots(bundle)
	require.NoError(t, err)
	h = startProxy(t, pol, res, func(c *Config) { c.UpstreamRoots = roots })
	code, body = get(t, h.client(runRoots(t, h)), url)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "private api", body)
	assert.Equal(t, "Bearer "+canary, <-seen)
}

func TestLoadUpstreamRootsRefusesAFileWithoutCertificates(t *testing.T) {
	roots, err := LoadUpstreamRoots("")
	require.NoError(t, err)
	assert.Nil(t, roots, "no file: the system roots")

	bad := filepath.Join(t.TempDir(), "empty.pem")
	require.NoError(t, os.WriteFile(bad, []byte("not a certificate\n"), 0o644))
	_, err = LoadUpstreamRoots(bad)
	require.ErrorIs(t, err, ErrBadConfig)
	_, err = LoadUpstreamRoots(filepath.Join(t.TempDir(), "missing.pem"))
	require.ErrorIs(t, err, ErrBadConfig)
}

// runRoots trusts the run CA of h's proxy, as the sandbox does.
func runRoots(t *testing.T, h *harness) *x509.CertPool {
	t.Helper()
	caPEM, err := os.ReadFile(h.p.CAPath())
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	return pool
}
