package attest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
)

// ErrKey marks a key file that cannot be used: unreadable, not PEM, or not
// an ECDSA P-256 or Ed25519 key of the right kind.
var ErrKey = errors.New("attest: unusable key")

// Signer signs envelopes with the host's private key: ECDSA P-256 (SHA-256,
// ASN.1 signatures, as cosign makes) or Ed25519. It implements dsse.Signer
// and never exposes the key.
type Signer struct {
	key   crypto.Signer
	keyID string
}

var _ dsse.Signer = (*Signer)(nil)

// Verifier checks envelope signatures with a public key. It implements
// dsse.Verifier.
type Verifier struct {
	pub   crypto.PublicKey
	keyID string
}

var _ dsse.Verifier = (*Verifier)(nil)

// LoadSigner reads a PEM private key file: PKCS #8 ("PRIVATE KEY", as
// `openssl genpkey` and cosign's unencrypted keys write) holding an ECDSA
// P-256 or Ed25519 key, or SEC 1 ("EC PRIVATE KEY") holding a P-256 key.
func LoadSigner(path string) (*Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: read private key: %w", ErrKey, err)
	}
	s, err := ParseSigner(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ParseSigner reads a PEM private key as LoadSigner does.
func ParseSigner(pemData []byte) (*Signer, error) {
	block, _ := pem.Decode(pemData)
	if block == nil {
		return nil, fmt.Errorf("%w: no PEM block: give a PEM private key (openssl genpkey -algorithm ed25519)", ErrKey)
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "ENCRYPTED PRIVATE KEY", "ENCRYPTED SIGSTORE PRIVATE KEY":
		return nil, fmt.Errorf("%w: the private key is encrypted: give an unencrypted PKCS #8 key file readable only by the executor", ErrKey)
	default:
		return nil, fmt.Errorf("%w: PEM block %q is not a private key: give a \"PRIVATE KEY\" (PKCS #8) file", ErrKey, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKey, err)
	}
	var signer crypto.Signer
	switch k := key.(type) {
	case ed25519.PrivateKey:
		signer = k
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("%w: ECDSA key on %s: use P-256", ErrKey, k.Curve.Params().Name)
		}
		signer = k
	default:
		return nil, fmt.Errorf("%w: %T keys are not supported: use ECDSA P-256 or Ed25519", ErrKey, key)
	}
	id, err := dsse.SHA256KeyID(signer.Public())
	if err != nil {
		return nil, fmt.Errorf("%w: key ID: %w", ErrKey, err)
	}
	return &Signer{key: signer, keyID: id}, nil
}

// Sign signs data (a DSSE pre-authentication encoding).
func (s *Signer) Sign(_ context.Context, data []byte) ([]byte, error) {
	switch k := s.key.(type) {
	case ed25519.PrivateKey:
		return ed25519.Sign(k, data), nil
	case *ecdsa.PrivateKey:
		sum := sha256.Sum256(data)
		return ecdsa.SignASN1(rand.Reader, k, sum[:])
	}
	return nil, fmt.Errorf("%w: %T", ErrKey, s.key)
}

// KeyID is the key's SSH SHA256 fingerprint, as DSSE verifiers compute it.
func (s *Signer) KeyID() (string, error) { return s.keyID, nil }

// String names the key by its ID only, so that printing a Signer (or a
// struct holding one) never shows the private key.
func (s *Signer) String() string { return "attest signer " + s.keyID }

// GoString is String, for %#v.
func (s *Signer) GoString() string { return s.String() }

// LogValue is the key ID, for log/slog.
func (s *Signer) LogValue() slog.Value { return slog.StringValue(s.keyID) }

// Public returns the public half of the key.
func (s *Signer) Public() crypto.PublicKey { return s.key.Public() }

// LoadVerifier reads a PEM public key file ("PUBLIC KEY", PKIX), as
// `openssl pkey -pubout` and `cosign generate-key-pair` write.
func LoadVerifier(path string) (*Verifier, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: read public key: %w", ErrKey, err)
	}
	v, err := ParseVerifier(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// ParseVerifier reads a PEM public key as LoadVerifier does.
func ParseVerifier(pemData []byte) (*Verifier, error) {
	block, _ := pem.Decode(pemData)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("%w: no PEM \"PUBLIC KEY\" block: give the signer's public key (openssl pkey -pubout -in KEY)", ErrKey)
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKey, err)
	}
	return NewVerifier(pub)
}

// NewVerifier returns a Verifier for an ECDSA P-256 or Ed25519 public key.
func NewVerifier(pub crypto.PublicKey) (*Verifier, error) {
	switch k := pub.(type) {
	case ed25519.PublicKey:
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("%w: ECDSA key on %s: use P-256", ErrKey, k.Curve.Params().Name)
		}
	default:
		return nil, fmt.Errorf("%w: %T keys are not supported: use ECDSA P-256 or Ed25519", ErrKey, pub)
	}
	id, err := dsse.SHA256KeyID(pub)
	if err != nil {
		return nil, fmt.Errorf("%w: key ID: %w", ErrKey, err)
	}
	return &Verifier{pub: pub, keyID: id}, nil
}

// errBadSignature is what Verify returns for a signature the key did not
// make.
var errBadSignature = errors.New("signature does not match the key")

// Verify checks sig over data.
func (v *Verifier) Verify(_ context.Context, data, sig []byte) error {
	switch k := v.pub.(type) {
	case ed25519.PublicKey:
		if ed25519.Verify(k, data, sig) {
			return nil
		}
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(data)
		if ecdsa.VerifyASN1(k, sum[:], sig) {
			return nil
		}
	}
	return errBadSignature
}

// KeyID is the key's SSH SHA256 fingerprint.
func (v *Verifier) KeyID() (string, error) { return v.keyID, nil }

// Public returns the public key.
func (v *Verifier) Public() crypto.PublicKey { return v.pub }
