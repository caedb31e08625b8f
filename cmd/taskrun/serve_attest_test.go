package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"html"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/persist"
)

// attestKey makes an Ed25519 key pair: its signer, and its public key as a
// PEM file in dir.
func attestKey(t *testing.T, dir, name string) (*attest.Signer, string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	require.NoError(t, err)
	s, err := attest.ParseSigner(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	require.NoError(t, err)
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	file := filepath.Join(dir, name+".pub")
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644))
	return s, file
}

// attestedRun submits a task as alice and stores, for its run, an output
// log and an isolation record and the envelope signer s makes of them (s
// nil: unsigned), as a worker does. It returns the run's reference and the
// envelope.
func attestedRun(t *testing.T, url string, st *persist.Store, s *attest.Signer) (persist.RunRef, []byte) {
	t.Helper()
	ctx := context.Background()
	alice, err := client.New(url, testUserToken, nil)
	require.NoError(t, err)
	sub, err := alice.Submit(ctx, controlplane.SubmitRequest{Prompt: "attest me"}, nil)
	require.NoError(t, err)
	ref := persist.RunRef{UserID: "alice", ConversationID: server.DefaultConversation, TaskID: sub.TaskID, RunID: sub.RunID}
	var subjects []attest.Subject
	for name, body := range map[string]string{"output.log": "hello from the run\n", "audit.json": `{"version":1}`} {
		info, err := st.PutRunFile(ctx, ref, name, strings.NewReader(body), "application/octet-stream")
		require.NoError(t, err)
		subjects = append(subjects, attest.Subject{Name: info.Key, SHA256: info.SHA256})
	}
	pred := attest.Predicate{Run: attest.RunIdentity{UserID: ref.UserID, ConversationID: ref.ConversationID, TaskID: ref.TaskID, RunID: ref.RunID},
		Image: attest.Image{Ref: "taskrun/agent:local"}, Outcome: attest.Outcome{Status: "SUCCEEDED"}}
	env, err := attest.Sign(ctx, s, subjects, pred)
	require.NoError(t, err)
	_, err = st.PutRunFile(ctx, ref, attest.ObjectName, bytes.NewReader(env), "application/json")
	require.NoError(t, err)
	return ref, env
}

// get fetches path with token and returns the status and the body,
// HTML entities decoded.
func get(t *testing.T, url, path, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, html.UnescapeString(string(body))
}

// attestSection is the attestation section of a run page.
func attestSection(t *testing.T, page string) string {
	t.Helper()
	i := strings.Index(page, `<section id="attestation"`)
	require.GreaterOrEqual(t, i, 0, "the run page has no attestation section: %s", page)
	j := strings.Index(page[i:], "</section>")
	require.Positive(t, j)
	return page[i : i+j]
}

// TestServeAttestations: serve --attest-pub checks each run's stored
// attestation on its page, against the blob store, for its tenant only; the
// user API serves the envelope itself.
func TestServeAttestations(t *testing.T) {
	dir := t.TempDir()
	host, pubFile := attestKey(t, dir, "host")
	stranger, _ := attestKey(t, dir, "stranger")
	hostID, _ := host.KeyID()
	strangerID, _ := stranger.KeyID()
	_, otherPub := attestKey(t, dir, "other-host")
	// Two trusted keys, the signer's second: each envelope is checked with
	// the key its signature names.
	url, storeURL := startServe(t, "--attest-pub", otherPub, "--attest-pub", pubFile)
	ctx := context.Background()
	st, err := persist.Open(ctx, storeURL)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })

	ref, env := attestedRun(t, url, st, host)
	page := "/ui/runs/" + ref.RunID

	t.Run("verified", func(t *testing.T) {
		code, body := get(t, url, page, testUserToken)
		require.Equal(t, http.StatusOK, code, body)
		sec := attestSection(t, body)
		assert.Contains(t, sec, `data-verdict="verified"`)
		assert.Contains(t, sec, "verified, signed by "+hostID)
		assert.Contains(t, sec, "2 of 2 attested objects match")
	})

	t.Run("the API serves the envelope to its tenant only", func(t *testing.T) {
		alice, err := client.New(url, testUserToken, nil)
		require.NoError(t, err)
		got, err := alice.Attestation(ctx, ref.RunID)
		require.NoError(t, err)
		assert.Equal(t, env, got, "the stored envelope, byte for byte")
		code, _ := get(t, url, "/v1/runs/"+ref.RunID+"/attestation", testUserToken)
		assert.Equal(t, http.StatusOK, code)

		bob, err := client.New(url, testOtherUserToken, nil)
		require.NoError(t, err)
		_, err = bob.Attestation(ctx, ref.RunID)
		require.ErrorIs(t, err, client.ErrNotFound)
		codeAtt, bodyAtt := get(t, url, "/v1/runs/"+ref.RunID+"/attestation", testOtherUserToken)
		codeRun, bodyRun := get(t, url, "/v1/runs/"+ref.RunID, testOtherUserToken)
		assert.Equal(t, http.StatusNotFound, codeAtt)
		assert.Equal(t, codeRun, codeAtt, "the same answer as for the run itself")
		assert.Equal(t, bodyRun, bodyAtt)
		code, body := get(t, url, page, testOtherUserToken)
		assert.Equal(t, http.StatusNotFound, code)
		assert.NotContains(t, body, hostID)
	})

	t.Run("a changed byte is named", func(t *testing.T) {
		_, err := st.PutRunFile(ctx, ref, "output.log", strings.NewReader("hello from the run!"), "application/octet-stream")
		require.NoError(t, err)
		key, err := persist.RunKey(ref, "output.log")
		require.NoError(t, err)
		code, body := get(t, url, page, testUserToken)
		require.Equal(t, http.StatusOK, code, body)
		sec := attestSection(t, body)
		assert.Contains(t, sec, `data-verdict="problems"`)
		assert.Contains(t, sec, "1 problem")
		assert.Contains(t, sec, `<tr data-kind="digest"><td>digest</td><td class="mono">`+key+`</td>`)
		assert.NotContains(t, sec, "audit.json", "only the changed object is named")
	})

	t.Run("unsigned", func(t *testing.T) {
		ref, _ := attestedRun(t, url, st, nil)
		_, body := get(t, url, "/ui/runs/"+ref.RunID, testUserToken)
		sec := attestSection(t, body)
		assert.Contains(t, sec, `data-verdict="unsigned"`)
		assert.Contains(t, sec, `data-kind="unsigned"`)
	})

	t.Run("unknown key", func(t *testing.T) {
		ref, _ := attestedRun(t, url, st, stranger)
		_, body := get(t, url, "/ui/runs/"+ref.RunID, testUserToken)
		sec := attestSection(t, body)
		assert.Contains(t, sec, `data-verdict="unknown-key"`)
		assert.Contains(t, sec, "signed by an unknown key "+strangerID)
		assert.Contains(t, sec, "none of this server's keys")
		assert.Contains(t, sec, hostID, "the trusted keys are named")
	})

	t.Run("what the envelope says is escaped", func(t *testing.T) {
		sub, err := client.New(url, testUserToken, nil)
		require.NoError(t, err)
		r, err := sub.Submit(ctx, controlplane.SubmitRequest{Prompt: "hostile"}, nil)
		require.NoError(t, err)
		hostile := persist.RunRef{UserID: "alice", ConversationID: server.DefaultConversation, TaskID: r.TaskID, RunID: r.RunID}
		env, err := attest.Sign(ctx, nil, []attest.Subject{{Name: "elsewhere/<script>alert(1)</script>\x1b[2J", SHA256: strings.Repeat("ab", 32)}},
			attest.Predicate{Run: attest.RunIdentity{UserID: "alice", ConversationID: hostile.ConversationID, TaskID: hostile.TaskID, RunID: hostile.RunID}})
		require.NoError(t, err)
		_, err = st.PutRunFile(ctx, hostile, attest.ObjectName, bytes.NewReader(env), "application/json")
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodGet, url+"/ui/runs/"+r.RunID, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testUserToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		sec := attestSection(t, string(raw))
		assert.Contains(t, sec, `data-kind="outside"`, "the subject is named")
		assert.NotContains(t, sec, "<script>")
		assert.NotContains(t, sec, "\x1b", "no terminal escape reaches the page")
		assert.Contains(t, sec, "&lt;script&gt;")
	})

	t.Run("no attestation", func(t *testing.T) {
		alice, err := client.New(url, testUserToken, nil)
		require.NoError(t, err)
		sub, err := alice.Submit(ctx, controlplane.SubmitRequest{Prompt: "not run"}, nil)
		require.NoError(t, err)
		code, body := get(t, url, "/v1/runs/"+sub.RunID+"/attestation", testUserToken)
		assert.Equal(t, http.StatusNotFound, code)
		var e struct{ Error string }
		require.NoError(t, json.Unmarshal([]byte(body), &e))
		assert.Contains(t, e.Error, "has no attestation")
		_, body = get(t, url, "/ui/runs/"+sub.RunID, testUserToken)
		assert.Contains(t, attestSection(t, body), `data-verdict="none"`)
	})
}

// TestServeAttestationsWithoutKeys: without --attest-pub a run's page names
// the envelope's signer and says it is not checked.
func TestServeAttestationsWithoutKeys(t *testing.T) {
	host, _ := attestKey(t, t.TempDir(), "host")
	hostID, _ := host.KeyID()
	url, storeURL := startServe(t)
	st, err := persist.Open(context.Background(), storeURL)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	ref, _ := attestedRun(t, url, st, host)
	code, body := get(t, url, "/ui/runs/"+ref.RunID, testUserToken)
	require.Equal(t, http.StatusOK, code, body)
	sec := attestSection(t, body)
	assert.Contains(t, sec, `data-verdict="unchecked"`)
	assert.Contains(t, sec, "signed by "+hostID+"; not checked")
}

// TestServeRefusesABadAttestPub: a key file that is no public key stops
// serve at start with the fix.
func TestServeRefusesABadAttestPub(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pub")
	require.NoError(t, os.WriteFile(bad, []byte("not a key"), 0o644))
	tok := filepath.Join(dir, "u.tok")
	require.NoError(t, os.WriteFile(tok, []byte("alice "+testUserToken+"\n"), 0o600))
	wtok := filepath.Join(dir, "w.tok")
	require.NoError(t, os.WriteFile(wtok, []byte(testWorkerToken+"\n"), 0o600))
	_, stderr, code := taskrunCmd("serve", "--listen", "127.0.0.1:0", "--db", "sqlite://"+filepath.Join(dir, "cp.db"), "--store", "mem://",
		"--worker-token-file", wtok, "--user-token-file", tok, "--attest-pub", bad)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--attest-pub")
	assert.Contains(t, stderr, "openssl pkey -pubout")
}
