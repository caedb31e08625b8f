package attest_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"testing"

	"github.com/sigstore/sigstore/pkg/signature"
	sigdsse "github.com/sigstore/sigstore/pkg/signature/dsse"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/attest"
)

// sigstoreVerify checks env with sigstore's DSSE verifier, the one cosign's
// verify-blob-attestation uses, and returns the payload it accepted.
func sigstoreVerify(t *testing.T, pubPEM, env []byte) ([]byte, error) {
	t.Helper()
	block, _ := pem.Decode(pubPEM)
	require.NotNil(t, block)
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	require.NoError(t, err)
	sv, err := signature.LoadVerifier(pub, crypto.SHA256)
	require.NoError(t, err)
	var payload []byte
	v := sigdsse.WrapVerifier(sv, sigdsse.WithExpectedPayloadType(attest.PayloadType), sigdsse.WithDecodedPayload(&payload))
	err = v.VerifySignature(bytes.NewReader(env), nil)
	return payload, err
}

// specVerify checks env as the DSSE and in-toto specifications say, with
// the standard library alone: PAE is "DSSEv1 <len> <type> <len> <body>".
func specVerify(pubPEM, env []byte) ([]byte, error) {
	block, _ := pem.Decode(pubPEM)
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	var e struct {
		PayloadType string `json:"payloadType"`
		Payload     string `json:"payload"`
		Signatures  []struct {
			Sig string `json:"sig"`
		} `json:"signatures"`
	}
	if err := json.Unmarshal(env, &e); err != nil {
		return nil, err
	}
	body, err := base64.StdEncoding.DecodeString(e.Payload)
	if err != nil {
		return nil, err
	}
	pae := fmt.Appendf(nil, "DSSEv1 %d %s %d %s", len(e.PayloadType), e.PayloadType, len(body), body)
	for _, s := range e.Signatures {
		sig, err := base64.StdEncoding.DecodeString(s.Sig)
		if err != nil {
			return nil, err
		}
		switch k := pub.(type) {
		case ed25519.PublicKey:
			if ed25519.Verify(k, pae, sig) {
				return body, nil
			}
		case *ecdsa.PublicKey:
			sum := sha256.Sum256(pae)
			if ecdsa.VerifyASN1(k, sum[:], sig) {
				return body, nil
			}
		}
	}
	return nil, fmt.Errorf("no signature verifies")
}

// An unmodified envelope verifies with verifiers taskrun does not
// implement, whose statement reads as in-toto v1 with plain JSON, and whose
// subjects match the stored bytes hashed here; a tampered one does not.
func TestIndependentVerifiersAgree(t *testing.T) {
	for _, alg := range []string{"ed25519", "ecdsa"} {
		t.Run(alg, func(t *testing.T) {
			ctx := t.Context()
			kp := newKeyPair(t, alg)
			r := storeRun(t, ctx, openStore(t), runID, kp.signer)

			payload, err := sigstoreVerify(t, kp.pubPEM, r.envelope)
			require.NoError(t, err)
			specPayload, err := specVerify(kp.pubPEM, r.envelope)
			require.NoError(t, err)
			assert.Equal(t, payload, specPayload)

			var st struct {
				Type          string `json:"_type"`
				PredicateType string `json:"predicateType"`
				Subject       []struct {
					Name   string            `json:"name"`
					Digest map[string]string `json:"digest"`
				} `json:"subject"`
				Predicate map[string]any `json:"predicate"`
			}
			require.NoError(t, json.Unmarshal(payload, &st))
			assert.Equal(t, "https://in-toto.io/Statement/v1", st.Type)
			assert.Equal(t, attest.PredicateType, st.PredicateType)
			require.Len(t, st.Subject, len(r.keys))
			for _, s := range st.Subject {
				rc, err := r.st.Open(ctx, s.Name)
				require.NoError(t, err)
				h := sha256.New()
				_, err = io.Copy(h, rc)
				rc.Close()
				require.NoError(t, err)
				assert.Equal(t, hex.EncodeToString(h.Sum(nil)), s.Digest["sha256"], s.Name)
			}
			assert.Equal(t, "r1", st.Predicate["run"].(map[string]any)["runId"])

			tampered := replaceInPayload(t, r.envelope, `"runtime":"runc"`, `"runtime":"runsc"`)
			_, err = sigstoreVerify(t, kp.pubPEM, tampered)
			assert.Error(t, err)
			_, err = specVerify(kp.pubPEM, tampered)
			assert.Error(t, err)
			other := newKeyPair(t, alg)
			_, err = sigstoreVerify(t, other.pubPEM, r.envelope)
			assert.Error(t, err)
		})
	}
}
