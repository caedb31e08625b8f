package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/workerclient"
)

// testServer is a server on a fake backend and an in-memory store, whose
// uid 1000 is tenant "alice".
func testServer(t *testing.T, op egress.Operator) *Server {
	t.Helper()
	st, err := persist.Open(context.Background(), "mem://")
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	h, err := executor.New(context.Background(), executor.Config{Root: t.TempDir(), Backend: sandboxfake.New(), Store: st})
	require.NoError(t, err)
	s, err := New(Config{
		Host: h, Maxima: runlimits.Maxima{MemoryBytes: 1 << 30}, Egress: op,
		Models: func(name string) (config.ModelEntry, error) {
			if name != "scripted" {
				return config.ModelEntry{}, errors.New("scripted only")
			}
			return config.ModelEntry{Provider: config.ProviderScripted, Name: "builtin:demo"}, nil
		},
		Tenant: func(uid uint32) (string, error) {
			if uid == 1000 {
				return "alice", nil
			}
			return UserNameTenant(uid)
		},
	})
	require.NoError(t, err)
	return s
}

func request(mod func(*RunRequest)) RunRequest {
	r := RunRequest{RunID: "r1", Conversation: "c", Task: "t", Session: "s", Command: []string{"true"}}
	if mod != nil {
		mod(&r)
	}
	return r
}

func TestSpecIsThePeersTenants(t *testing.T) {
	op := egress.Operator{Rules: []egress.Rule{{Host: "example.com", Port: 443}}}
	s := testServer(t, op)
	alice := Peer{UID: 1000}

	spec, _, err := s.spec(alice, request(nil))
	require.NoError(t, err)
	assert.Equal(t, "alice", spec.Task.UserID, "no --user: the peer's tenant")
	assert.Equal(t, s.cfg.Host.Defaults().Policy, *spec.Policy, "no limits: the daemon's defaults")

	_, status, err := s.spec(alice, request(func(r *RunRequest) { r.User = "bob" }))
	assert.Equal(t, http.StatusForbidden, status)
	assert.ErrorContains(t, err, `runs as tenant "alice" only`)

	spec, _, err = s.spec(Peer{UID: 0}, request(func(r *RunRequest) { r.User = "bob" }))
	require.NoError(t, err)
	assert.Equal(t, "bob", spec.Task.UserID, "root may name any user")

	_, status, err = s.spec(alice, request(func(r *RunRequest) { r.Limits = workerclient.Limits{MemoryBytes: 2 << 30} }))
	assert.Equal(t, http.StatusForbidden, status)
	assert.ErrorIs(t, err, runlimits.ErrOverMaximum)
	spec, _, err = s.spec(alice, request(func(r *RunRequest) { r.Limits = workerclient.Limits{MemoryBytes: 512 << 20, CPUs: 0.5} }))
	require.NoError(t, err)
	assert.Equal(t, int64(512<<20), spec.Policy.MemoryBytes)
	assert.Equal(t, int64(5e8), spec.Policy.NanoCPUs)

	wide, _ := json.Marshal(egress.TenantRequest{Rules: []egress.Rule{{Host: "example.org", Port: 443}}})
	_, status, err = s.spec(alice, request(func(r *RunRequest) { r.Egress = wide }))
	assert.Equal(t, http.StatusForbidden, status)
	assert.ErrorIs(t, err, egress.ErrNotGranted)
	narrow, _ := json.Marshal(egress.TenantRequest{Rules: []egress.Rule{{Host: "example.com", Port: 443}}})
	spec, _, err = s.spec(alice, request(func(r *RunRequest) { r.Egress = narrow }))
	require.NoError(t, err)
	require.Len(t, spec.Egress.Rules, 1)

	_, status, err = s.spec(alice, request(func(r *RunRequest) { r.Model = "openai:gpt" }))
	assert.Equal(t, http.StatusForbidden, status)
	assert.ErrorContains(t, err, "scripted only")

	_, status, err = s.spec(alice, request(func(r *RunRequest) { r.RunID = "../x" }))
	assert.Equal(t, http.StatusBadRequest, status)
	require.Error(t, err)
}
