package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// A submission is a tenant's request, through real `taskrun serve` and
// `taskrun worker` processes: serve refuses what no host may grant (400),
// the worker refuses what its operator does not (FAILED, nothing started).

// submitRefused submits req and returns serve's 400 message.
func submitRefused(t *testing.T, c *client.Client, req controlplane.SubmitRequest) string {
	t.Helper()
	_, err := c.Submit(context.Background(), req, nil)
	var he *client.HTTPError
	require.ErrorAs(t, err, &he)
	require.Equal(t, http.StatusBadRequest, he.StatusCode, he.Message)
	return he.Message
}

func TestTenantRequestsAreRefusedAtSubmission(t *testing.T) {
	env := newCrashEnv(t)
	serve := startServeProcs(t, env, "sqlite://"+filepath.Join(t.TempDir(), "cp.db"), 1, 4*time.Second, "--max-run-pids", "8192")[0]
	c, err := client.New(serve.url, fleetUserToken, nil)
	require.NoError(t, err)
	base := controlplane.SubmitRequest{Prompt: "hi", Image: testImage, Command: []string{"true"}}

	// A credential source of the host: one message, whatever it names.
	secretFile := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secretFile, []byte("s3cret\n"), 0o600))
	var msgs []string
	for _, cred := range []string{
		`{"host":"a.example","header":"Authorization","value_env":"` + workerTokenEnv + `"}`,
		`{"host":"a.example","header":"Authorization","value_env":"NO_SUCH_VARIABLE"}`,
		`{"host":"a.example","header":"Authorization","value_file":"` + secretFile + `"}`,
		`{"host":"a.example","header":"Authorization","value_file":"/no/such/file"}`,
		`{"host":"a.example","header":"Authorization","value_file":"/etc/machine-id"}`,
		`{"host":"a.example","header":"Authorization","value_file":"/etc"}`,
	} {
		req := base
		req.Egress = json.RawMessage(`{"rules":[{"host":"a.example"}],"credentials":[` + cred + `]}`)
		msgs = append(msgs, submitRefused(t, c, req))
	}
	for _, m := range msgs {
		assert.Equal(t, msgs[0], m, "no file-existence or environment oracle")
	}
	assert.Contains(t, msgs[0], `{"id": "ID"}`, "the message names the fix")
	assert.NotContains(t, msgs[0], secretFile)

	// An IP-literal rule for a loopback, private or metadata address.
	for _, host := range []string{"127.0.0.1", "::1", "10.0.0.1", "169.254.169.254"} {
		req := base
		req.Egress = json.RawMessage(`{"rules":[{"host":"` + host + `","port":8080}]}`)
		assert.Contains(t, submitRefused(t, c, req), "cannot reach loopback, private, link-local or metadata addresses", host)
	}

	// Limits over serve's maxima.
	req := base
	req.Limits = workerclient.Limits{PIDs: 100000}
	msg := submitRefused(t, c, req)
	assert.Contains(t, msg, "limits.pids 100000 is over the maximum 8192")
	assert.Contains(t, msg, "--max-run-pids")

	runs, err := c.ListRuns(context.Background(), "", 10)
	require.NoError(t, err)
	assert.Empty(t, runs, "nothing refused was queued")
}

func TestTenantRequestsAreRefusedByTheWorker(t *testing.T) {
	env := newCrashEnv(t)
	// serve allows more processes than the worker: the worker's maximum is
	// the one that holds for the runs it takes.
	serve := startServeProcs(t, env, "sqlite://"+filepath.Join(t.TempDir(), "cp.db"), 1, 4*time.Second, "--max-run-pids", "8192")[0]
	c, err := client.New(serve.url, fleetUserToken, nil)
	require.NoError(t, err)
	ctx := context.Background()
	countCreates := watchCreates(t)
	submit := func(req controlplane.SubmitRequest) string {
		req.Prompt, req.Image, req.Runtime = "hi", testImage, "runc"
		req.Command = []string{"sh", "-c", "echo ran"}
		resp, err := c.Submit(ctx, req, nil)
		require.NoError(t, err)
		return resp.RunID
	}
	tooMany := submit(controlplane.SubmitRequest{Limits: workerclient.Limits{PIDs: 5000}})
	outside := submit(controlplane.SubmitRequest{Egress: json.RawMessage(`{"rules":[{"host":"evil.example"}]}`)})
	notYours := submit(controlplane.SubmitRequest{Egress: json.RawMessage(`{"rules":[{"host":"api.github.com"}],"credentials":[{"id":"github"}]}`)})
	fine := submit(controlplane.SubmitRequest{Limits: workerclient.Limits{PIDs: 4096}})

	fleet := newWorkerFleet(t, env, serve.url)
	fleet.startOn(serve.url, "", 2, "--allow", "api.github.com",
		"--credential", "id=github,tenants=someone-else,host=api.github.com,header=Authorization,value-env=TENANT_E2E_TOKEN")

	final := func(id string) controlplane.Run {
		var r controlplane.Run
		require.Eventually(t, func() bool {
			var err error
			r, err = c.GetRun(ctx, id)
			return err == nil && r.Status.Terminal()
		}, 3*time.Minute, 100*time.Millisecond, "run %s never ended", id)
		return r
	}
	for id, want := range map[string][]string{
		tooMany:  {"limits.pids 5000 is over the maximum 4096", "--max-run-pids"},
		outside:  {"egress rule 1 (evil.example) is within no rule of this host's (api.github.com)"},
		notYours: {`credential "github": no credential of that id is configured for you`},
	} {
		r := final(id)
		assert.Equal(t, model.StatusFailed, r.Status, id)
		for _, w := range want {
			assert.Contains(t, r.Error, w, id)
		}
		assert.Nil(t, r.StartedAt, "run %s never started", id)
	}
	r := final(fine)
	assert.Equal(t, model.StatusSucceeded, r.Status, "%s: %s", fine, r.Error)
	assert.Equal(t, "ran\n", r.Output)
	creates := countCreates()
	assert.Zero(t, creates[tooMany]+creates[outside]+creates[notYours], "no container for a refused run")
	assert.Positive(t, creates[fine], "the run within the maxima had its container")
}
