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
	"io"
	"log/slog"
	"os"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
)

// ErrKey marks a key file that cannot be used: unreadable, not PEM, or not
// an ECDSA P-256 or Ed25519 key of the right kind.
var ErrKey = errors.New("attest: unusable key")

// Signer signs envelopes with the host's private key: ECDSA P-256 (SHA-256,
// ASN.1 signatures, as cosign makes) or Ed25519. It implements dsse.Signer.
// The key is a crypto.Signer: a key file read into memory (LoadSigner), or
// one whose private half never leaves a KMS or an HSM (NewSigner).
//
// A Signer never exposes its key: printed with any fmt verb, logged with
// log/slog, or copied into another value and printed there, it shows only
// its key ID. Its zero value signs nothing.
type Signer struct {
	// k is behind a pointer so that a copy of a Signer, printed as a
	// field fmt cannot call methods on (an unexported one), shows an
	// address, not the key.
	k *signingKey
}

// signingKey is a Signer's key, its public half and its ID. The key is
// reached only through sign, a closure: fmt prints a func as an address
// whatever the verb and however deep, where it would print the bytes of an
// ed25519.PrivateKey held in a field (a verb a pointer does not take, %s,
// makes fmt print the value it points to).
type signingKey struct {
	sign  func(rand io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error)
	pub   crypto.PublicKey
	keyID string
	check *Verifier
}

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
	return NewSigner(signer)
}

// ErrSign marks a signature the key could not make, or made wrong: a
// KMS or HSM that failed, or whose signature its own public key does not
// verify.
var ErrSign = errors.New("attest: signing failed")

// NewSigner returns a Signer that signs with key. key is any crypto.Signer
// whose public key is ECDSA P-256 or Ed25519: a private key in memory, or
// a handle on one held in a KMS or an HSM (a cloud KMS client's signer, a
// PKCS #11 key), so that the private key never enters the executor's
// memory. Public is called once, here.
//
// key.Sign is called once per run, as the run ends, with a SHA-256 digest
// and crypto.SHA256 for ECDSA (which must return an ASN.1 signature, as
// crypto.Signer specifies) and with the message itself and crypto.Hash(0)
// for Ed25519. A remote signer must bound the call itself: crypto.Signer
// takes no context. Each signature is checked with the public key before it
// is used, so a KMS that signs with another key than the one it reports
// fails the run's signing (ErrSign) instead of storing an envelope that can
// never verify.
func NewSigner(key crypto.Signer) (*Signer, error) {
	if key == nil {
		return nil, fmt.Errorf("%w: no key", ErrKey)
	}
	pub := key.Public()
	check, err := NewVerifier(pub)
	if err != nil {
		return nil, err
	}
	return &Signer{k: &signingKey{sign: key.Sign, pub: pub, keyID: check.keyID, check: check}}, nil
}

// Sign signs data (a DSSE pre-authentication encoding) and checks the
// signature with the public key.
func (s *Signer) Sign(ctx context.Context, data []byte) ([]byte, error) {
	if s == nil || s.k == nil {
		return nil, fmt.Errorf("%w: no key", ErrSign)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSign, err)
	}
	var sig []byte
	var err error
	switch s.k.pub.(type) {
	case ed25519.PublicKey:
		sig, err = s.k.sign(rand.Reader, data, crypto.Hash(0))
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(data)
		sig, err = s.k.sign(rand.Reader, sum[:], crypto.SHA256)
	default:
		err = fmt.Errorf("%T keys are not supported", s.k.pub)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: key %s: %w", ErrSign, s.k.keyID, err)
	}
	if err := s.k.check.Verify(ctx, data, sig); err != nil {
		return nil, fmt.Errorf("%w: key %s made a signature its public key does not verify: the signer signs with another key than the one it reports", ErrSign, s.k.keyID)
	}
	return sig, nil
}

// KeyID is the key's SSH SHA256 fingerprint, as DSSE verifiers compute it.
func (s *Signer) KeyID() (string, error) {
	if s == nil || s.k == nil {
		return "", fmt.Errorf("%w: no key", ErrKey)
	}
	return s.k.keyID, nil
}

// id is the key ID, or "none" for a Signer without a key.
func (s Signer) id() string {
	if s.k == nil {
		return "none"
	}
	return s.k.keyID
}

// String names the key by its ID only, so that printing a Signer (or a
// struct holding one) never shows the private key.
func (s Signer) String() string { return "attest signer " + s.id() }

// GoString is String, for %#v.
func (s Signer) GoString() string { return s.String() }

// Format writes String for every verb, so that no verb (%d, %x, ...)
// reaches the key.
func (s Signer) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, s.String()) }

// LogValue is the key ID, for log/slog.
func (s Signer) LogValue() slog.Value { return slog.StringValue(s.id()) }

// Public returns the public half of the key.
func (s *Signer) Public() crypto.PublicKey {
	if s == nil || s.k == nil {
		return nil
	}
	return s.k.pub
}

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
