package attest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
)

// ErrNotVerified is wrapped by Result.Err when an envelope did not verify.
var ErrNotVerified = errors.New("attestation not verified")

// ErrMissing is what an Opener wraps (or returns through errors.Is) for an
// object that does not exist; Verify then reports the subject as missing
// rather than failing. Callers map their store's not-found error to it.
var ErrMissing = errors.New("object missing")

// Opener opens a stored object by the key a subject names.
type Opener func(ctx context.Context, key string) (io.ReadCloser, error)

// Kinds of Problem.
const (
	// ProblemUnsigned: the envelope has no signature.
	ProblemUnsigned = "unsigned"
	// ProblemSignature: no signature verifies with the given key: the
	// payload (statement or predicate) or the signature was changed, or
	// another key signed it.
	ProblemSignature = "signature"
	// ProblemStatement: the payload is not a taskrun run statement.
	ProblemStatement = "statement"
	// ProblemRun: the predicate names another run than the one checked.
	ProblemRun = "run"
	// ProblemOutside: a subject is outside the run's and its tenant's
	// storage.
	ProblemOutside = "outside"
	// ProblemMissing: a subject is not in the store.
	ProblemMissing = "missing"
	// ProblemDigest: a subject's stored bytes hash to another digest.
	ProblemDigest = "digest"
	// ProblemUnattested: the run's storage holds an object no subject
	// covers.
	ProblemUnattested = "unattested"
)

// Problem is one reason an envelope did not verify.
type Problem struct {
	Kind string `json:"kind"`
	// Object is the store key concerned, if any.
	Object string `json:"object,omitempty"`
	Detail string `json:"detail"`
}

func (p Problem) String() string {
	if p.Object != "" {
		return fmt.Sprintf("%s: %s: %s", p.Kind, p.Object, p.Detail)
	}
	return fmt.Sprintf("%s: %s", p.Kind, p.Detail)
}

// Expect is what the verifier knows independently of the envelope.
type Expect struct {
	// Run is the run the envelope must be about; its non-empty IDs are
	// compared with the predicate's.
	Run RunIdentity
	// Prefixes are the key prefixes every subject must be under (the
	// run's and its tenant's run-global storage); none checks nothing.
	Prefixes []string
	// Listed are the keys stored under the run's prefix, when the caller
	// listed them: any not among the subjects (but the envelope itself) is
	// reported unattested.
	Listed []string
}

// Result is Verify's verdict.
type Result struct {
	// Verified is true when there is no problem.
	Verified bool `json:"verified"`
	// KeyID names the key whose signature verified; empty if none did.
	KeyID string `json:"keyId,omitempty"`
	// SignedBy lists the key IDs the envelope's signatures name.
	SignedBy []string `json:"signedBy,omitempty"`
	// Subjects counts the subjects; Checked those whose bytes matched.
	Subjects int `json:"subjects"`
	Checked  int `json:"checked"`
	// Predicate is the statement's predicate, when it could be read.
	Predicate *Predicate `json:"predicate,omitempty"`
	// Problems lists every reason the envelope did not verify.
	Problems []Problem `json:"problems,omitempty"`
}

// Err returns nil for a verified envelope, else an error wrapping
// ErrNotVerified that names every problem.
func (r Result) Err() error {
	if r.Verified {
		return nil
	}
	msgs := make([]string, len(r.Problems))
	for i, p := range r.Problems {
		msgs[i] = p.String()
	}
	return fmt.Errorf("%w: %s", ErrNotVerified, strings.Join(msgs, "; "))
}

// Verify checks an envelope made by Sign: its signature against v, its
// statement, that it is about want.Run, and every subject's bytes, opened
// with open and hashed again. It reports every problem it finds rather than
// stopping at the first. The error is for failures that prevent a verdict
// (an object that cannot be read for another reason than being missing,
// a cancelled ctx); a verdict that refuses the envelope is in Result.
func Verify(ctx context.Context, envelope []byte, v *Verifier, want Expect, open Opener) (Result, error) {
	var res Result
	add := func(kind, object, detail string, args ...any) {
		res.Problems = append(res.Problems, Problem{Kind: kind, Object: object, Detail: fmt.Sprintf(detail, args...)})
	}
	var env dsse.Envelope
	if err := json.Unmarshal(envelope, &env); err != nil {
		add(ProblemStatement, "", "not a DSSE envelope: %v", err)
		return res, nil
	}
	if env.PayloadType != PayloadType {
		add(ProblemStatement, "", "payload type %q, want %q", env.PayloadType, PayloadType)
	}
	for _, s := range env.Signatures {
		res.SignedBy = append(res.SignedBy, s.KeyID)
	}
	checkSignature(ctx, &env, v, &res, add)
	payload, err := env.DecodeB64Payload()
	if err != nil {
		add(ProblemStatement, "", "payload is not base64: %v", err)
		return done(res), nil
	}
	subjects, pred, err := ParseStatement(payload)
	if err != nil {
		add(ProblemStatement, "", "%v", err)
		return done(res), nil
	}
	res.Predicate = &pred
	res.Subjects = len(subjects)
	checkRun(want.Run, pred.Run, add)
	names := make(map[string]bool, len(subjects))
	for _, s := range subjects {
		names[s.Name] = true
		if len(want.Prefixes) > 0 && !slices.ContainsFunc(want.Prefixes, func(p string) bool { return strings.HasPrefix(s.Name, p) }) {
			add(ProblemOutside, s.Name, "not under the run's storage (%s)", strings.Join(want.Prefixes, ", "))
			continue
		}
		got, err := hashObject(ctx, open, s.Name)
		switch {
		case errors.Is(err, ErrMissing):
			add(ProblemMissing, s.Name, "not in the store")
		case err != nil:
			return res, fmt.Errorf("attest: verify %s: %w", s.Name, err)
		case got != s.SHA256:
			add(ProblemDigest, s.Name, "stored bytes have sha256 %s, the statement says %s", got, s.SHA256)
		default:
			res.Checked++
		}
	}
	for _, k := range want.Listed {
		if !names[k] && !strings.HasSuffix(k, "/"+ObjectName) {
			add(ProblemUnattested, k, "stored with the run but not covered by the statement")
		}
	}
	return done(res), nil
}

// checkSignature records whether a signature of env verifies with v.
func checkSignature(ctx context.Context, env *dsse.Envelope, v *Verifier, res *Result, add func(kind, object, detail string, args ...any)) {
	if len(env.Signatures) == 0 {
		add(ProblemUnsigned, "", "the envelope has no signature: the host that wrote it had no signing key (--attest-key)")
		return
	}
	if v == nil {
		add(ProblemSignature, "", "no public key given to check the signature with (--key)")
		return
	}
	ev, err := dsse.NewEnvelopeVerifier(v)
	if err != nil {
		add(ProblemSignature, "", "%v", err)
		return
	}
	keys, err := ev.Verify(ctx, env)
	if err == nil && len(keys) > 0 {
		res.KeyID = keys[0].KeyID
		return
	}
	if !slices.Contains(res.SignedBy, v.keyID) {
		add(ProblemSignature, "", "signed by key %s, not by the given key %s", strings.Join(res.SignedBy, ", "), v.keyID)
		return
	}
	add(ProblemSignature, "", "the signature of key %s does not match the payload: the statement, its predicate or the signature was changed", v.keyID)
}

// checkRun compares the run the predicate names with the one expected.
func checkRun(want, got RunIdentity, add func(kind, object, detail string, args ...any)) {
	for _, f := range []struct{ name, want, got string }{
		{"user", want.UserID, got.UserID},
		{"conversation", want.ConversationID, got.ConversationID},
		{"task", want.TaskID, got.TaskID},
		{"run", want.RunID, got.RunID},
	} {
		if f.want != "" && f.want != f.got {
			add(ProblemRun, "", "the statement is about %s %q, not %q: it belongs to another run", f.name, f.got, f.want)
		}
	}
}

func done(res Result) Result {
	res.Verified = len(res.Problems) == 0
	return res
}

// hashObject returns the hex SHA-256 of the object at key.
func hashObject(ctx context.Context, open Opener, key string) (string, error) {
	r, err := open(ctx, key)
	if err != nil {
		return "", err
	}
	defer r.Close()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
