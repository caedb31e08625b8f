package attest_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/attest"
)

// remoteKey stands for a key held in a KMS or an HSM: a crypto.Signer that
// holds no private key of its own and asks "the device" for each signature.
type remoteKey struct {
	device crypto.Signer // the private key, inside the device
	pub    crypto.PublicKey
	calls  atomic.Int32
	fail   error
}

func (k *remoteKey) Public() crypto.PublicKey { return k.pub }

func (k *remoteKey) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	k.calls.Add(1)
	if k.fail != nil {
		return nil, k.fail
	}
	return k.device.Sign(r, digest, opts)
}

func newRemoteKey(t *testing.T, alg string) *remoteKey {
	t.Helper()
	var dev crypto.Signer
	switch alg {
	case "ed25519":
		_, k, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		dev = k
	case "ecdsa":
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		dev = k
	}
	return &remoteKey{device: dev, pub: dev.Public()}
}

// A key held elsewhere signs through NewSigner: its envelope verifies with
// its public key, with taskrun's verifier and the independent ones, and its
// key ID is the one a file key of the same key would have.
func TestAKeyHeldElsewhereSignsThroughNewSigner(t *testing.T) {
	ctx := t.Context()
	for _, alg := range []string{"ed25519", "ecdsa"} {
		t.Run(alg, func(t *testing.T) {
			k := newRemoteKey(t, alg)
			s, err := attest.NewSigner(k)
			require.NoError(t, err)
			v, err := attest.NewVerifier(k.pub)
			require.NoError(t, err)
			sid, _ := s.KeyID()
			vid, _ := v.KeyID()
			assert.Equal(t, vid, sid)

			r := storeRun(t, ctx, openStore(t), runID, s)
			assert.Equal(t, int32(1), k.calls.Load(), "one signature per run")
			res := r.verify(t, ctx, r.envelope, v)
			require.NoError(t, res.Err())
			assert.Equal(t, sid, res.KeyID)
			assert.Equal(t, sid, res.Predicate.Executor.KeyID)
			pubPEM := pemPublic(t, k.pub)
			_, err = sigstoreVerify(t, pubPEM, r.envelope)
			require.NoError(t, err)
			_, err = specVerify(pubPEM, r.envelope)
			require.NoError(t, err)

			other := newRemoteKey(t, alg)
			ov, err := attest.NewVerifier(other.pub)
			require.NoError(t, err)
			assert.Contains(t, kinds(r.verify(t, ctx, r.envelope, ov)), attest.ProblemSignature)
		})
	}
}

// A signer that signs with another key than the one it reports (a KMS
// handle on the wrong key version) fails the signing, rather than storing
// an envelope that never verifies; a signer that fails says which key.
func TestASignerThatSignsWrongFails(t *testing.T) {
	ctx := t.Context()
	for _, alg := range []string{"ed25519", "ecdsa"} {
		t.Run(alg, func(t *testing.T) {
			k := newRemoteKey(t, alg)
			k.pub = newRemoteKey(t, alg).pub
			s, err := attest.NewSigner(k)
			require.NoError(t, err)
			_, err = attest.Sign(ctx, s, []attest.Subject{{Name: "a", SHA256: strings.Repeat("ab", 32)}}, attest.Predicate{Run: runID})
			require.ErrorIs(t, err, attest.ErrSign)
			assert.ErrorContains(t, err, "another key than the one it reports")

			down := errors.New("kms: service unavailable")
			k = newRemoteKey(t, alg)
			k.fail = down
			s, err = attest.NewSigner(k)
			require.NoError(t, err)
			id, _ := s.KeyID()
			_, err = attest.Sign(ctx, s, []attest.Subject{{Name: "a", SHA256: strings.Repeat("ab", 32)}}, attest.Predicate{Run: runID})
			require.ErrorIs(t, err, attest.ErrSign)
			require.ErrorIs(t, err, down)
			assert.ErrorContains(t, err, id)
		})
	}
}

// NewSigner refuses keys that are not ECDSA P-256 or Ed25519, and no key.
func TestNewSignerRefusesOtherKeys(t *testing.T) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	_, err = attest.NewSigner(rk)
	assert.ErrorIs(t, err, attest.ErrKey)
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	_, err = attest.NewSigner(p384)
	assert.ErrorIs(t, err, attest.ErrKey)
	assert.ErrorContains(t, err, "P-256")
	_, err = attest.NewSigner(nil)
	assert.ErrorIs(t, err, attest.ErrKey)
	var zero attest.Signer
	_, err = zero.Sign(context.Background(), []byte("x"))
	assert.ErrorIs(t, err, attest.ErrSign)
}

// pemPublic is pub as a PEM "PUBLIC KEY".
func pemPublic(t *testing.T, pub crypto.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}
