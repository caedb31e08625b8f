package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/model"
)

// getAs answers GET path with token: status, content type and error message.
func getAs(t *testing.T, url, path, token string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var e struct{ Error string }
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, resp.Header.Get("Content-Type"), e.Error
}

// TestAttestationRoute: the run's stored envelope is served to its owner
// byte for byte; another tenant gets the 404 of every run call; a run
// without one, or with one over the bound, is answered clearly.
func TestAttestationRoute(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	ref := model.RunRef{UserID: "alice", ConversationID: server.DefaultConversation, TaskID: sub.TaskID, RunID: sub.RunID}

	code, _, msg := getAs(t, e.url, "/v1/runs/"+sub.RunID+"/attestation", userToken)
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, msg, "run "+sub.RunID+" has no attestation")

	env, err := attest.Sign(ctx, nil, []attest.Subject{{Name: "x", SHA256: strings.Repeat("0", 64)}},
		attest.Predicate{Run: attest.RunIdentity{UserID: "alice", RunID: sub.RunID}})
	require.NoError(t, err)
	_, err = e.blobs.PutRunFile(ctx, ref, attest.ObjectName, bytes.NewReader(env), "application/json")
	require.NoError(t, err)
	got, err := e.user.Attestation(ctx, sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, env, got)
	code, ct, _ := getAs(t, e.url, "/v1/runs/"+sub.RunID+"/attestation", userToken)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, server.EnvelopeContentType, ct)

	_, err = e.bob.Attestation(ctx, sub.RunID)
	require.ErrorIs(t, err, client.ErrNotFound)
	codeA, _, msgA := getAs(t, e.url, "/v1/runs/"+sub.RunID+"/attestation", bobToken)
	codeR, _, msgR := getAs(t, e.url, "/v1/runs/"+sub.RunID, bobToken)
	assert.Equal(t, http.StatusNotFound, codeA)
	assert.Equal(t, codeR, codeA)
	assert.Equal(t, msgR, msgA, "another tenant's run is answered as for every run call")

	_, err = e.blobs.PutRunFile(ctx, ref, attest.ObjectName, bytes.NewReader(make([]byte, attest.MaxEnvelopeBytes+1)), "application/json")
	require.NoError(t, err)
	code, _, msg = getAs(t, e.url, "/v1/runs/"+sub.RunID+"/attestation", userToken)
	assert.Equal(t, http.StatusBadGateway, code)
	assert.Contains(t, msg, "over 4194304 bytes")
}
