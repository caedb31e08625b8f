package webui

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/termsafe"
)

// attestTimeout bounds the check of one run's attestation on its page: the
// signature, and every subject read again from the store and hashed.
const attestTimeout = 30 * time.Second

// BlobSource is implemented by a Source whose runs' objects are in a blob
// store: a run's page then shows the run's attestation (package attest),
// checked against the store when the handler has keys (Options.AttestKeys).
type BlobSource interface {
	// Blobs is the store, nil when the source has none.
	Blobs() *persist.Store
}

// Blobs is the shared blob store.
func (s *ControlPlaneSource) Blobs() *persist.Store { return s.Store }

// Blobs is the store the runs are indexed in.
func (s *StoreSource) Blobs() *persist.Store { return s.Store }

// Verdicts of attestationView.
const (
	attestNone       = "none"        // the run stored no attestation
	attestUnchecked  = "unchecked"   // no key configured: the signer is shown, not checked
	attestVerified   = "verified"    // signature, run and every subject check
	attestUnsigned   = "unsigned"    // the envelope has no signature
	attestUnknownKey = "unknown-key" // signed by a key not configured
	attestProblems   = "problems"    // signed by a configured key, but something does not check
	attestError      = "error"       // the check could not be done
)

// attestationView is a run's attestation as its page shows it. Every string
// is escaped for a terminal (termsafe); html/template escapes for the page.
type attestationView struct {
	Verdict string
	// Headline is the verdict in words.
	Headline string
	// KeyIDs are the keys the envelope's signatures name.
	KeyIDs []string
	// Problems are what did not verify, each naming its object and kind.
	Problems []attest.Problem
	// Subjects and Checked count the statement's subjects and those whose
	// stored bytes matched.
	Subjects, Checked int
}

// attestation reads run's attestation from the source's store and, with
// keys, verifies it there. It is computed for each page view (nothing is
// cached): a changed object shows at the next view. Nil when the source has
// no blob store.
func (h *Handler) attestation(ctx context.Context, run Run) *attestationView {
	bs, ok := h.src.(BlobSource)
	if !ok || bs.Blobs() == nil {
		return nil
	}
	st := bs.Blobs()
	ctx, cancel := context.WithTimeout(ctx, attestTimeout)
	defer cancel()
	ref := run.Ref()
	env, err := attest.ReadStored(ctx, st, ref)
	if errors.Is(err, attest.ErrNoEnvelope) {
		return &attestationView{Verdict: attestNone, Headline: "no attestation: " + attest.ErrNoEnvelope.Error()}
	}
	if err != nil {
		return h.attestFailed(run, err)
	}
	ids, err := attest.SignedBy(env)
	if err != nil {
		return &attestationView{Verdict: attestProblems, Headline: "1 problem",
			Problems: []attest.Problem{{Kind: attest.ProblemStatement, Object: escapedKey(ref, attest.ObjectName), Detail: termsafe.String(err.Error())}}}
	}
	v := &attestationView{KeyIDs: escapeAll(ids)}
	if len(h.attestKeys) == 0 {
		v.Verdict = attestUnchecked
		if len(ids) == 0 {
			v.Headline = "unsigned; not checked: this server has no public key to check attestations with (serve --attest-pub)"
		} else {
			v.Headline = "signed by " + strings.Join(v.KeyIDs, ", ") + "; not checked: this server has no public key to check it with (serve --attest-pub)"
		}
		return v
	}
	key := attest.KeyFor(env, h.attestKeys)
	check := key
	if check == nil {
		check = h.attestKeys[0] // unsigned or unknown key: still re-hash every subject
	}
	res, err := attest.VerifyStored(ctx, st, ref, env, check)
	if err != nil {
		return h.attestFailed(run, err)
	}
	v.Subjects, v.Checked = res.Subjects, res.Checked
	for _, p := range res.Problems {
		if key == nil && len(ids) > 0 && p.Kind == attest.ProblemSignature {
			// Checked with the first key for want of the right one: say so
			// of all the keys this server trusts.
			p.Detail = fmt.Sprintf("signed by key %s, none of this server's keys (%s)", strings.Join(ids, ", "), strings.Join(h.attestKeyIDs(), ", "))
		}
		v.Problems = append(v.Problems, attest.Problem{Kind: p.Kind, Object: termsafe.String(p.Object), Detail: termsafe.String(p.Detail)})
	}
	switch {
	case res.Verified:
		v.Verdict, v.Headline = attestVerified, "verified, signed by "+termsafe.String(res.KeyID)
	case len(ids) == 0:
		v.Verdict, v.Headline = attestUnsigned, "unsigned"
	case key == nil:
		v.Verdict, v.Headline = attestUnknownKey, "signed by an unknown key "+strings.Join(v.KeyIDs, ", ")
	default:
		v.Verdict, v.Headline = attestProblems, fmt.Sprintf("%d problems", len(res.Problems))
		if len(res.Problems) == 1 {
			v.Headline = "1 problem"
		}
	}
	return v
}

// attestKeyIDs are the IDs of the keys the handler checks with.
func (h *Handler) attestKeyIDs() []string {
	ids := make([]string, len(h.attestKeys))
	for i, k := range h.attestKeys {
		ids[i], _ = k.KeyID()
	}
	return ids
}

// attestFailed is the view of an attestation that could not be checked.
func (h *Handler) attestFailed(run Run, err error) *attestationView {
	if errors.Is(err, context.DeadlineExceeded) {
		return &attestationView{Verdict: attestError, Headline: fmt.Sprintf("not checked: the check took longer than %s", attestTimeout)}
	}
	if errors.Is(err, attest.ErrEnvelopeTooLarge) {
		return &attestationView{Verdict: attestError, Headline: "not checked: " + err.Error()}
	}
	if !errors.Is(err, context.Canceled) {
		h.log.Warn("check attestation", "run", run.RunID, "err", err)
	}
	return &attestationView{Verdict: attestError, Headline: "not checked: the run's objects could not be read; see the server's log"}
}

// escapedKey is the store key of the run's object name, escaped.
func escapedKey(ref persist.RunRef, name string) string {
	k, _ := persist.RunKey(ref, name)
	return termsafe.String(k)
}

func escapeAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = termsafe.String(s)
	}
	return out
}
