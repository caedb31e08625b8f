package attest_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/taskrun/taskrun/attest"
)

// hsmKey stands for a key in an HSM or a KMS: a crypto.Signer whose Sign
// asks the device, which keeps the private key. A real one is a cloud KMS
// client's signer or a PKCS #11 key handle.
type hsmKey struct{ device *ecdsa.PrivateKey }

func (k hsmKey) Public() crypto.PublicKey { return &k.device.PublicKey }

func (k hsmKey) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	// Here the device is in memory; a KMS would make a network call.
	return k.device.Sign(r, digest, opts)
}

// A key held in an HSM or a KMS signs run attestations through NewSigner;
// the executor takes the Signer as its attestation key
// (executor.Config.AttestKey), as it takes one read from a key file.
func ExampleNewSigner() {
	device, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	signer, err := attest.NewSigner(hsmKey{device})
	if err != nil {
		panic(err)
	}

	// A run's one stored object, and its envelope.
	ctx := context.Background()
	log := []byte("hello from the run\n")
	sum := sha256.Sum256(log)
	key := "tenants/u1/conversations/c1/tasks/t1/runs/r1/output.log"
	run := attest.RunIdentity{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"}
	envelope, err := attest.Sign(ctx, signer, []attest.Subject{{Name: key, SHA256: hex.EncodeToString(sum[:])}},
		attest.Predicate{Run: run, Outcome: attest.Outcome{Status: "SUCCEEDED"}})
	if err != nil {
		panic(err)
	}

	// An auditor checks it with the public key alone.
	verifier, err := attest.NewVerifier(hsmKey{device}.Public())
	if err != nil {
		panic(err)
	}
	res, err := attest.Verify(ctx, envelope, verifier, attest.Expect{Run: run},
		func(_ context.Context, name string) (io.ReadCloser, error) {
			if name != key {
				return nil, attest.ErrMissing
			}
			return io.NopCloser(bytes.NewReader(log)), nil
		})
	if err != nil {
		panic(err)
	}
	id, _ := signer.KeyID()
	fmt.Println("verified:", res.Verified, "by the HSM's key:", res.KeyID == id)
	// Output: verified: true by the HSM's key: true
}
