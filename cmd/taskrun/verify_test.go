package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/sigstore/sigstore/pkg/signature"
	sigdsse "github.com/sigstore/sigstore/pkg/signature/dsse"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/persist"
)

// writeKeyPair writes a new ECDSA P-256 key pair as PEM files and returns
// their paths.
func writeKeyPair(t *testing.T) (priv, pub string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(k)
	require.NoError(t, err)
	pubDER, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	require.NoError(t, err)
	dir := t.TempDir()
	priv, pub = filepath.Join(dir, "attest.key"), filepath.Join(dir, "attest.pub")
	require.NoError(t, os.WriteFile(priv, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644))
	return priv, pub
}

// attestedHost is a host's store and root, on which runs are made and
// verified with the CLI.
type attestedHost struct {
	t          *testing.T
	store      string // file:// URL
	storeDir   string
	root, user string
}

func newAttestedHost(t *testing.T) *attestedHost {
	if testing.Short() {
		t.Skip("runs real containers")
	}
	dir := t.TempDir()
	return &attestedHost{t: t, store: "file://" + dir, storeDir: dir, root: t.TempDir(), user: tenant(t)}
}

// run makes run runID with the extra flags and returns its --json result.
func (h *attestedHost) run(runID string, flags ...string) runJSON {
	h.t.Helper()
	args := append([]string{"run", "--root", h.root, "--store", h.store, "--helpers-dir", "", "--gc=false",
		"--user", h.user, "--run-id", runID, "--image", testImage, "--json"}, flags...)
	args = append(args, "--", "sh", "-c", "echo attested output; mkdir -p /taskrun/artifacts && echo result > /taskrun/artifacts/result.txt")
	var stdout, stderr lockedbuf.Buffer
	code := dispatch(context.Background(), args, &stdout, &stderr)
	require.Equal(h.t, exitOK, code, stderr.String())
	var res runJSON
	require.NoError(h.t, json.Unmarshal([]byte(stdout.String()), &res), stdout.String())
	return res
}

// runJSON is the part of `taskrun run --json` these tests read.
type runJSON struct {
	RunID       string               `json:"run_id"`
	ImageDigest string               `json:"image_digest"`
	Stored      []persist.ObjectInfo `json:"stored"`
}

// verify runs `taskrun verify` and returns stdout, stderr and its status.
func (h *attestedHost) verify(args ...string) (string, string, int) {
	h.t.Helper()
	var stdout, stderr lockedbuf.Buffer
	code := dispatch(context.Background(), append([]string{"verify", "--store", h.store}, args...), &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

// path is the file holding key in the file store.
func (h *attestedHost) path(key string) string {
	return filepath.Join(h.storeDir, filepath.FromSlash(key))
}

func (h *attestedHost) runKey(runID, name string) string {
	key, err := persist.RunKey(persist.RunRef{UserID: h.user, ConversationID: defaultConversation, TaskID: defaultTask, RunID: runID}, name)
	require.NoError(h.t, err)
	return key
}

// A real run on the Docker engine stores a signed attestation over every
// object it stored, which `taskrun verify` and sigstore's DSSE verifier
// accept; each tamper is then refused, naming what was changed.
func TestARealRunIsAttestedAndVerified(t *testing.T) {
	h := newAttestedHost(t)
	priv, pub := writeKeyPair(t)
	res := h.run("signed1", "--attest-key", priv)
	envKey := h.runKey("signed1", attest.ObjectName)

	// Every object the run stored is a subject, and the envelope is stored.
	var stored []string
	for _, o := range res.Stored {
		stored = append(stored, o.Key)
	}
	require.Contains(t, stored, envKey)

	stdout, stderr, code := h.verify("--key", pub, "signed1")
	require.Equal(t, exitOK, code, stdout+stderr)
	assert.Contains(t, stdout, "VERIFIED: run signed1")
	t.Log(stdout)

	stdout, _, code = h.verify("--key", pub, "--json", "signed1")
	require.Equal(t, exitOK, code)
	var rep verifyReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	assert.True(t, rep.Verified)
	assert.Equal(t, len(res.Stored)-1, rep.Subjects, "every stored object but the envelope is a subject")
	assert.Equal(t, rep.Subjects, rep.Checked)
	p := rep.Predicate
	require.NotNil(t, p)
	assert.Equal(t, "signed1", p.Run.RunID)
	assert.Equal(t, h.user, p.Run.UserID)
	assert.Equal(t, testImage, p.Image.Ref)
	assert.Equal(t, res.ImageDigest, p.Image.Digest)
	assert.NotEmpty(t, p.Image.Digest)
	assert.Equal(t, "runc", p.Runtime)
	assert.Equal(t, "docker", p.Backend)
	assert.Equal(t, "SUCCEEDED", p.Outcome.Status)
	require.NotNil(t, p.Isolation)
	assert.Equal(t, "pass", p.Isolation.Audit, "the live audit passed: %v", p.Isolation.Failed)
	assert.Equal(t, "not-run", p.Isolation.SelfCheck, "these runs have no helpers")
	var posture struct {
		CapDrop     []string `json:"cap_drop"`
		SecurityOpt []string `json:"security_opt"`
		NetworkMode string   `json:"network_mode"`
	}
	require.NoError(t, json.Unmarshal(p.Isolation.Posture, &posture))
	assert.Equal(t, []string{"ALL"}, posture.CapDrop)
	assert.Contains(t, posture.SecurityOpt, "no-new-privileges")
	assert.Equal(t, "none", posture.NetworkMode)
	var policy map[string]any
	require.NoError(t, json.Unmarshal(p.Policy, &policy))
	assert.Equal(t, "none", policy["network_mode"])
	assert.NotEmpty(t, p.Timings.Phases)
	assert.False(t, p.Timings.StartedAt.IsZero())
	assert.Equal(t, rep.KeyID, p.Executor.KeyID)

	// An independent verifier, the one cosign uses, accepts the stored
	// envelope with the public key alone.
	envelope, err := os.ReadFile(h.path(envKey))
	require.NoError(t, err)
	require.NoError(t, sigstoreVerifyFile(t, pub, envelope))
	// The envelope as a FILE verifies too.
	envFile := filepath.Join(t.TempDir(), "envelope.json")
	require.NoError(t, os.WriteFile(envFile, envelope, 0o600))
	stdout, stderr, code = h.verify("--key", pub, envFile)
	require.Equal(t, exitOK, code, stdout+stderr)

	t.Run("one byte of each subject", func(t *testing.T) {
		var tampered []string
		for _, o := range res.Stored {
			if o.Key == envKey || o.Size == 0 {
				continue
			}
			tampered = append(tampered, o.Key)
			path := h.path(o.Key)
			orig, err := os.ReadFile(path)
			require.NoError(t, err)
			changed := bytes.Clone(orig)
			changed[len(changed)/2] ^= 0x20
			require.NoError(t, os.WriteFile(path, changed, 0o600))
			stdout, _, code := h.verify("--key", pub, "signed1")
			require.NoError(t, os.WriteFile(path, orig, 0o600))
			assert.Equal(t, exitFailure, code, o.Key)
			assert.Contains(t, stdout, "NOT VERIFIED")
			assert.Contains(t, stdout, "digest: "+o.Key, "the verdict names the changed object")
		}
		for _, name := range []string{taskrun.OutputLogName, taskrun.AuditRecordName, taskrun.SessionStateName, taskrun.CollectionRecordName} {
			assert.Contains(t, tampered, h.runKey("signed1", name))
		}
		artifact, err := persist.ArtifactKey(persist.RunRef{UserID: h.user, ConversationID: defaultConversation, TaskID: defaultTask, RunID: "signed1"}, "result.txt")
		require.NoError(t, err)
		assert.Contains(t, tampered, artifact)
		_, _, code := h.verify("--key", pub, "signed1")
		assert.Equal(t, exitOK, code, "restored, the run verifies again")
	})

	// rewrite stores the run's envelope changed by change, and restores it
	// when the test ends.
	rewrite := func(t *testing.T, change func(env map[string]any)) {
		var env map[string]any
		require.NoError(t, json.Unmarshal(envelope, &env))
		change(env)
		out, err := json.Marshal(env)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(h.path(envKey), out, 0o600))
		t.Cleanup(func() { require.NoError(t, os.WriteFile(h.path(envKey), envelope, 0o600)) })
	}

	t.Run("the predicate", func(t *testing.T) {
		rewrite(t, func(env map[string]any) {
			payload := bytes.Replace(payloadOf(envelope), []byte(`"status":"SUCCEEDED"`), []byte(`"status":"FAILED"`), 1)
			require.NotEqual(t, payloadOf(envelope), payload)
			env["payload"] = payload // encoding/json writes []byte as base64
		})
		stdout, _, code := h.verify("--key", pub, "signed1")
		assert.Equal(t, exitFailure, code)
		assert.Contains(t, stdout, "signature: the signature of key")
		assert.Contains(t, stdout, "does not match the payload")
	})

	t.Run("the signature", func(t *testing.T) {
		rewrite(t, func(env map[string]any) {
			s := env["signatures"].([]any)[0].(map[string]any)
			sig, err := base64.StdEncoding.DecodeString(s["sig"].(string))
			require.NoError(t, err)
			sig[len(sig)-1] ^= 0x01
			s["sig"] = base64.StdEncoding.EncodeToString(sig)
		})
		stdout, _, code := h.verify("--key", pub, "signed1")
		assert.Equal(t, exitFailure, code)
		assert.Contains(t, stdout, "signature: the signature of key")
	})

	t.Run("the key", func(t *testing.T) {
		_, otherPub := writeKeyPair(t)
		stdout, _, code := h.verify("--key", otherPub, "signed1")
		assert.Equal(t, exitFailure, code)
		assert.Contains(t, stdout, "signature: signed by key "+rep.KeyID+", not by the given key")
	})

	t.Run("an envelope swapped from another run of the tenant", func(t *testing.T) {
		h.run("signed2", "--attest-key", priv)
		other, err := os.ReadFile(h.path(h.runKey("signed2", attest.ObjectName)))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(h.path(envKey), other, 0o600))
		defer func() { require.NoError(t, os.WriteFile(h.path(envKey), envelope, 0o600)) }()
		stdout, _, code := h.verify("--key", pub, "signed1")
		assert.Equal(t, exitFailure, code)
		assert.Contains(t, stdout, `run: the statement is about run "signed2", not "signed1"`)
		// signed2 itself verifies: the refusal is the swap.
		_, _, code = h.verify("--key", pub, "signed2")
		assert.Equal(t, exitOK, code)
	})

	t.Run("a missing object", func(t *testing.T) {
		key := h.runKey("signed1", taskrun.OutputLogName)
		orig, err := os.ReadFile(h.path(key))
		require.NoError(t, err)
		require.NoError(t, os.Remove(h.path(key)))
		defer func() { require.NoError(t, os.WriteFile(h.path(key), orig, 0o600)) }()
		stdout, _, code := h.verify("--key", pub, "signed1")
		assert.Equal(t, exitFailure, code)
		assert.Contains(t, stdout, "missing: "+key)
	})
}

// A host without a key stores the attestation unsigned; verify refuses it.
func TestARunWithoutAKeyIsAttestedUnsigned(t *testing.T) {
	h := newAttestedHost(t)
	t.Setenv(envAttestKey, "")
	_, pub := writeKeyPair(t)
	h.run("unsigned1")
	stdout, _, code := h.verify("--key", pub, "unsigned1")
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, stdout, "unsigned: the envelope has no signature")
}

func TestVerifyRefusesBadArgumentsWithTheFix(t *testing.T) {
	_, stderr, code := taskrunCmd("verify", "r1")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--key is required")
	priv, _ := writeKeyPair(t)
	_, stderr, code = taskrunCmd("verify", "--key", priv, "r1")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "openssl pkey -pubout")
	_, stderr, code = taskrunCmd("run", "--attest-key", "/no/such/key", "--", "true")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--attest-key")
}

// sigstoreVerifyFile checks envelope with sigstore's DSSE verifier and the
// PEM public key file pub.
func sigstoreVerifyFile(t *testing.T, pub string, envelope []byte) error {
	t.Helper()
	data, err := os.ReadFile(pub)
	require.NoError(t, err)
	block, _ := pem.Decode(data)
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	require.NoError(t, err)
	sv, err := signature.LoadVerifier(key, crypto.SHA256)
	require.NoError(t, err)
	return sigdsse.WrapVerifier(sv, sigdsse.WithExpectedPayloadType(attest.PayloadType)).VerifySignature(bytes.NewReader(envelope), nil)
}
