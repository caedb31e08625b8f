package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"
)

// Lifetimes of the run CA and of the leaf certificates it issues.
const (
	caLifetime   = 7 * 24 * time.Hour
	leafLifetime = time.Hour
	// clockSkew backdates certificates so a container clock slightly behind still accepts them.
	clockSkew = 5 * time.Minute
)

// systemBundles are where Linux distributions keep the system roots.
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"/etc/ssl/cert.pem",
}

// runCA is the per-run certificate authority for intercepted hosts. Its
// key lives only in this process's memory. Name constraints limit it to the
// hosts the policy intercepts, so even a client that trusted it for
// everything would accept it for nothing else.
type runCA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	now     func() time.Time

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// newRunCA creates a CA constrained to hosts (names, "*.suffix" patterns or IP literals).
func newRunCA(hosts []string, now func() time.Time) (*runCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate run CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "taskrun egress run CA", Organization: []string{"taskrun"}},
		NotBefore:             now().Add(-clockSkew),
		NotAfter:              now().Add(caLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	var ipHosts bool
	for _, h := range hosts {
		if a, err := netip.ParseAddr(h); err == nil {
			ipHosts = true
			tmpl.PermittedIPRanges = append(tmpl.PermittedIPRanges, &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())})
			continue
		}
		// A constraint "example.com" covers example.com and every name below it.
		tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, strings.TrimPrefix(h, "*."))
	}
	if !ipHosts {
		tmpl.ExcludedIPRanges = []*net.IPNet{{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, {IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}
	}
	tmpl.PermittedDNSDomainsCritical = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create run CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse run CA: %w", err)
	}
	return &runCA{
		cert:    cert,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:     key,
		now:     now,
		leaves:  map[string]*tls.Certificate{},
	}, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}

// leaf returns a short-lived certificate for host, issued once and reused
// until it is close to expiry.
func (ca *runCA) leaf(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok && ca.now().Add(leafLifetime/4).Before(c.Leaf.NotAfter) {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate leaf key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    ca.now().Add(-clockSkew),
		NotAfter:     ca.now().Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = []net.IP{a.AsSlice()}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("issue leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse leaf for %s: %w", host, err)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}
	ca.leaves[host] = c
	return c, nil
}

// writeFiles writes the CA certificate and a bundle of the system roots plus
// the CA (when the host has system roots) and returns their paths.
func (ca *runCA) writeFiles(dir string) (certPath, bundlePath string, err error) {
	certPath = dir + "/" + CAName
	if err := writePublic(certPath, ca.certPEM); err != nil {
		return "", "", err
	}
	bundle := []byte{}
	for _, p := range systemBundles {
		if data, err := os.ReadFile(p); err == nil && len(data) > 0 {
			bundle = append(data, '\n')
			break
		}
	}
	bundlePath = dir + "/" + BundleName
	if err := writePublic(bundlePath, append(bundle, ca.certPEM...)); err != nil {
		return "", "", err
	}
	return certPath, bundlePath, nil
}

// writePublic writes a world-readable file, replacing any earlier one.
func writePublic(path string, data []byte) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
