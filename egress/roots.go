package egress

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// CAFlag is the operator's flag that names a CA bundle for brokered hosts.
const CAFlag = "--egress-ca"

// LoadUpstreamRoots returns the roots the proxy verifies intercepted
// upstreams with (Config.UpstreamRoots): the host's system roots plus every
// certificate of the PEM file, an operator's bundle for hosts served under
// a private CA. An empty file name returns nil, the system roots alone.
func LoadUpstreamRoots(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pemData, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: CA bundle: %w", ErrBadConfig, err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("%w: CA bundle %s holds no PEM certificate", ErrBadConfig, file)
	}
	return pool, nil
}

// untrustedUpstream reports whether err is an upstream TLS certificate the
// proxy's roots do not verify.
func untrustedUpstream(err error) bool {
	var unknown x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	return errors.As(err, &unknown) || errors.As(err, &verify)
}

// untrustedUpstreamFix is the operator's fix for an intercepted host whose
// certificate the proxy cannot verify.
func untrustedUpstreamFix(host string) string {
	return fmt.Sprintf("give taskrun the CA that signed %s's certificate as a PEM bundle with %s FILE (run, worker and daemon); the proxy checks a brokered host against the host's system roots (as SSL_CERT_FILE in taskrun's own environment sets them) and that bundle, not against anything inside the sandbox", host, CAFlag)
}
