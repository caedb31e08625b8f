package attest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/taskrun/taskrun/persist"
)

// MaxEnvelopeBytes bounds a stored envelope a verifier or server reads. A
// run's envelope is its statement (one subject per stored object) and a
// signature, far below it.
const MaxEnvelopeBytes = 4 << 20

// ErrNoEnvelope marks a run that stored no attestation: it ran before
// attestations, or never started a container.
var ErrNoEnvelope = errors.New("the run stored no attestation: it ran before attestations, or never started a container")

// ErrEnvelopeTooLarge marks a stored envelope over MaxEnvelopeBytes.
var ErrEnvelopeTooLarge = fmt.Errorf("attest: stored envelope is over %d bytes", MaxEnvelopeBytes)

// ReadStored reads the envelope run ref stored as ObjectName in st, at most
// MaxEnvelopeBytes of it. It wraps ErrNoEnvelope when the run has none.
func ReadStored(ctx context.Context, st *persist.Store, ref persist.RunRef) ([]byte, error) {
	rc, err := st.OpenRunFile(ctx, ref, ObjectName)
	if errors.Is(err, persist.ErrNotFound) {
		return nil, fmt.Errorf("run %s: %w", ref.RunID, ErrNoEnvelope)
	}
	if err != nil {
		return nil, fmt.Errorf("attest: read run %s's envelope: %w", ref.RunID, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxEnvelopeBytes+1))
	if err != nil {
		return nil, fmt.Errorf("attest: read run %s's envelope: %w", ref.RunID, err)
	}
	if len(data) > MaxEnvelopeBytes {
		return nil, fmt.Errorf("run %s: %w", ref.RunID, ErrEnvelopeTooLarge)
	}
	return data, nil
}

// VerifyStored verifies envelope as the attestation of run ref, whose
// objects are in st: Verify with the run's identity, its storage and its
// tenant's run-global storage as the only places a subject may be, and the
// objects listed under the run's storage, each of which a subject must
// cover.
func VerifyStored(ctx context.Context, st *persist.Store, ref persist.RunRef, envelope []byte, v *Verifier) (Result, error) {
	prefix, err := persist.RunPrefix(ref)
	if err != nil {
		return Result{}, fmt.Errorf("attest: the envelope names no valid run: %w", err)
	}
	tenant, err := persist.TenantPrefix(ref.UserID)
	if err != nil {
		return Result{}, fmt.Errorf("attest: %w", err)
	}
	listed, err := st.List(ctx, prefix)
	if err != nil {
		return Result{}, fmt.Errorf("attest: list run %s's objects: %w", ref.RunID, err)
	}
	want := Expect{
		Run:      RunIdentity{UserID: ref.UserID, ConversationID: ref.ConversationID, TaskID: ref.TaskID, RunID: ref.RunID},
		Prefixes: []string{prefix, tenant + "global/"},
		Listed:   listed,
	}
	return Verify(ctx, envelope, v, want, func(ctx context.Context, key string) (io.ReadCloser, error) {
		rc, err := st.Open(ctx, key)
		if errors.Is(err, persist.ErrNotFound) {
			return nil, fmt.Errorf("%w: %w", ErrMissing, err)
		}
		return rc, err
	})
}

// SignedBy returns the key IDs an envelope's signatures name, without
// checking any signature: empty for an unsigned envelope. The error is for
// bytes that are not a DSSE envelope.
func SignedBy(envelope []byte) ([]string, error) {
	var env dsse.Envelope
	if err := json.Unmarshal(envelope, &env); err != nil {
		return nil, fmt.Errorf("%w: not a DSSE envelope: %w", ErrInvalidStatement, err)
	}
	ids := make([]string, 0, len(env.Signatures))
	for _, s := range env.Signatures {
		ids = append(ids, s.KeyID)
	}
	return ids, nil
}

// KeyFor returns the key of keys whose ID a signature of envelope names,
// or nil when none does (an unsigned envelope, or one signed by a key not
// among keys). It chooses the key to check with; Verify does the checking.
func KeyFor(envelope []byte, keys []*Verifier) *Verifier {
	ids, err := SignedBy(envelope)
	if err != nil {
		return nil
	}
	for _, id := range ids {
		for _, k := range keys {
			if k.keyID == id {
				return k
			}
		}
	}
	return nil
}
