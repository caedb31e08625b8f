package attest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
)

// Sign makes the run's DSSE envelope: the Statement of subjects and pred,
// signed by s. With s nil (a host without a key) the envelope carries the
// statement with no signature, which Verify refuses as unsigned.
// pred.Executor.KeyID is set to s's key ID.
func Sign(ctx context.Context, s *Signer, subjects []Subject, pred Predicate) ([]byte, error) {
	pred.Executor.KeyID = ""
	if s != nil {
		id, err := s.KeyID()
		if err != nil {
			return nil, err
		}
		pred.Executor.KeyID = id
	}
	payload, err := Statement(subjects, pred)
	if err != nil {
		return nil, err
	}
	env := &dsse.Envelope{PayloadType: PayloadType, Payload: base64.StdEncoding.EncodeToString(payload), Signatures: []dsse.Signature{}}
	if s != nil {
		es, err := dsse.NewEnvelopeSigner(s)
		if err != nil {
			return nil, fmt.Errorf("attest: %w", err)
		}
		if env, err = es.SignPayload(ctx, PayloadType, payload); err != nil {
			return nil, fmt.Errorf("attest: sign: %w", err)
		}
	}
	out, err := json.MarshalIndent(env, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("attest: encode envelope: %w", err)
	}
	return append(out, '\n'), nil
}
