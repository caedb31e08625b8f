package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
)

// Attestations through real processes: `taskrun worker` and `taskrun daemon`
// sign each run's envelope with the host's --attest-key, `taskrun serve`
// serves it (and checks it on the run's page with --attest-pub), and
// `taskrun verify` accepts it with the host's public key only.

// verifyCmd runs the `taskrun verify` binary against store and returns its
// stdout and stderr, and its exit status.
func verifyCmd(t *testing.T, env *crashEnv, args ...string) (string, string, int) {
	t.Helper()
	cmd := env.command(t, nil, append([]string{"verify", "--store", env.store}, args...)...)
	var stdout, stderr lockedbuf.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return stdout.String(), stderr.String(), exitErr.ExitCode()
	}
	require.NoError(t, err)
	return stdout.String(), stderr.String(), 0
}

// keyIDOf is the key ID of the PEM public key file pub.
func keyIDOf(t *testing.T, pub string) string {
	t.Helper()
	v, err := attest.LoadVerifier(pub)
	require.NoError(t, err)
	id, err := v.KeyID()
	require.NoError(t, err)
	return id
}

// storedEnvelope is the envelope run runID of user stored in env's store,
// found through the store's run index as `taskrun verify RUN` finds it.
func storedEnvelope(t *testing.T, env *crashEnv, runID string) []byte {
	t.Helper()
	ctx := context.Background()
	st, err := persist.Open(ctx, env.store)
	require.NoError(t, err)
	defer st.Close()
	rec, err := runindex.Find(ctx, st, runID, env.user)
	require.NoError(t, err, "run %s is in the run index", runID)
	data, err := attest.ReadStored(ctx, st, rec.Ref())
	require.NoError(t, err, "run %s stored an attestation", runID)
	return data
}

// statementOf reads an envelope's statement, unchecked.
func statementOf(t *testing.T, envelope []byte) ([]attest.Subject, attest.Predicate) {
	t.Helper()
	subjects, pred, err := attest.ParseStatement(payloadOf(envelope))
	require.NoError(t, err)
	return subjects, pred
}

// awaitContainerRunning waits until runID's container is running on the
// engine.
func awaitContainerRunning(t *testing.T, runID string) {
	t.Helper()
	require.Eventually(t, func() bool {
		out, err := exec.Command("docker", "ps", "-q", "--filter", "status=running", "--filter", "label="+sandbox.LabelRun+"="+runID).Output()
		return err == nil && strings.TrimSpace(string(out)) != ""
	}, testdeadline.Scale(3*time.Minute), 100*time.Millisecond, "run %s's container never ran", runID)
}

// workerRuns submits a succeeded, a failed and a cancelled run to serve and
// returns their IDs, once each ended; a worker must be leasing from serve.
// The cancelled one is cancelled once it is RUNNING and its container runs.
func workerRuns(t *testing.T, c *client.Client) map[model.RunStatus]string {
	t.Helper()
	ctx := context.Background()
	submit := func(script string) string {
		resp, err := c.Submit(ctx, controlplane.SubmitRequest{
			Prompt: "attest", Image: testImage, Runtime: "runc", Command: []string{"sh", "-c", script},
			Limits: workerclient.Limits{MemoryBytes: 128 << 20, TimeoutMillis: 120000},
		}, nil)
		require.NoError(t, err)
		return resp.RunID
	}
	runs := map[model.RunStatus]string{
		model.StatusSucceeded: submit("echo attested output; mkdir -p /taskrun/artifacts && echo result > /taskrun/artifacts/result.txt"),
		model.StatusFailed:    submit("echo failing; exit 3"),
		model.StatusCancelled: submit("echo started; sleep 300"),
	}
	cancelled := runs[model.StatusCancelled]
	require.Eventually(t, func() bool {
		r, err := c.GetRun(ctx, cancelled)
		return err == nil && r.Status == model.StatusRunning
	}, testdeadline.Scale(3*time.Minute), 100*time.Millisecond, "run %s never ran", cancelled)
	awaitContainerRunning(t, cancelled)
	_, err := c.Cancel(ctx, cancelled)
	require.NoError(t, err)
	for want, id := range runs {
		var r controlplane.Run
		require.Eventually(t, func() bool {
			r, err = c.GetRun(ctx, id)
			return err == nil && r.Status.Terminal()
		}, testdeadline.Scale(3*time.Minute), 100*time.Millisecond, "run %s never ended", id)
		require.Equal(t, want, r.Status, "run %s: %s", id, r.Error)
	}
	return runs
}

// TestWorkerRunsAreSignedServedAndVerified: a worker with --attest-key signs
// the envelope of every run it ends, succeeded, failed or cancelled; serve
// serves it byte for byte as stored and its run page finds it verified with
// --attest-pub; `taskrun verify` passes with the worker's public key, on the
// run and on the served envelope, and fails with another.
func TestWorkerRunsAreSignedServedAndVerified(t *testing.T) {
	env := newCrashEnv(t)
	priv, pub := writeKeyPair(t)
	_, wrongPub := writeKeyPair(t)
	keyID := keyIDOf(t, pub)
	serve := startServeProcs(t, env, "sqlite://"+filepath.Join(t.TempDir(), "cp.db"), 1, 4*time.Second, "--attest-pub", pub)[0]
	c, err := client.New(serve.url, fleetUserToken, nil)
	require.NoError(t, err)
	ctx := context.Background()
	fleet := newWorkerFleet(t, env, serve.url)
	fleet.startOn(serve.url, "", 2, "--attest-key", priv)

	runs := workerRuns(t, c)
	for status, id := range runs {
		t.Run(string(status), func(t *testing.T) {
			stored := storedEnvelope(t, env, id)
			served, err := c.Attestation(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, stored, served, "serve serves the stored envelope byte for byte")
			signers, err := attest.SignedBy(served)
			require.NoError(t, err)
			assert.Equal(t, []string{keyID}, signers, "signed with the worker's key")
			subjects, pred := statementOf(t, served)
			assert.Equal(t, id, pred.Run.RunID)
			assert.Equal(t, string(status), pred.Outcome.Status)
			assert.Equal(t, keyID, pred.Executor.KeyID)
			assert.NotEmpty(t, pred.Image.Digest)
			assert.NotEmpty(t, subjects)
			if status == model.StatusFailed {
				assert.Equal(t, 3, pred.Outcome.ExitCode)
			}
			if status == model.StatusCancelled {
				assert.True(t, pred.Outcome.Cancelled)
			}

			stdout, stderr, code := verifyCmd(t, env, "--key", pub, "--user", env.user, id)
			require.Equal(t, exitOK, code, stdout+stderr)
			assert.Contains(t, stdout, "VERIFIED: run "+id+": signed by "+keyID)
			// The envelope as served verifies as a file too.
			file := filepath.Join(t.TempDir(), "attestation.intoto.json")
			require.NoError(t, os.WriteFile(file, served, 0o600))
			stdout, stderr, code = verifyCmd(t, env, "--key", pub, file)
			require.Equal(t, exitOK, code, stdout+stderr)

			stdout, _, code = verifyCmd(t, env, "--key", wrongPub, "--user", env.user, id)
			assert.Equal(t, exitFailure, code, stdout)
			assert.Contains(t, stdout, "NOT VERIFIED")
			assert.Contains(t, stdout, "signature: signed by key "+keyID+", not by the given key")
			stdout, _, code = verifyCmd(t, env, "--key", wrongPub, "--json", file)
			assert.Equal(t, exitFailure, code, stdout)
			var rep verifyReport
			require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
			assert.False(t, rep.Verified)

			code, body := get(t, serve.url, "/ui/runs/"+id, fleetUserToken)
			require.Equal(t, 200, code, body)
			sec := attestSection(t, body)
			assert.Contains(t, sec, `data-verdict="verified"`)
			assert.Contains(t, sec, "verified, signed by "+keyID)
		})
	}
}

// TestWorkerWithoutAKeyStoresUnsignedAttestations: a worker without a key
// stores and serve serves each run's statement unsigned, saying so (no
// signature, no key ID, a warning in the worker's log), and `taskrun verify`
// refuses it.
func TestWorkerWithoutAKeyStoresUnsignedAttestations(t *testing.T) {
	t.Setenv(envAttestKey, "")
	env := newCrashEnv(t)
	_, pub := writeKeyPair(t)
	serve := startServeProcs(t, env, "sqlite://"+filepath.Join(t.TempDir(), "cp.db"), 1, 4*time.Second, "--attest-pub", pub)[0]
	c, err := client.New(serve.url, fleetUserToken, nil)
	require.NoError(t, err)
	ctx := context.Background()
	fleet := newWorkerFleet(t, env, serve.url)
	w := fleet.startOn(serve.url, "", 2)

	resp, err := c.Submit(ctx, controlplane.SubmitRequest{Prompt: "attest", Image: testImage, Runtime: "runc",
		Command: []string{"sh", "-c", "echo unsigned output"}, Limits: workerclient.Limits{MemoryBytes: 128 << 20, TimeoutMillis: 120000}}, nil)
	require.NoError(t, err)
	id := resp.RunID
	r, err := c.Wait(ctx, id, 100*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, model.StatusSucceeded, r.Status, r.Error)

	served, err := c.Attestation(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, storedEnvelope(t, env, id), served)
	signers, err := attest.SignedBy(served)
	require.NoError(t, err)
	assert.Empty(t, signers, "no signature")
	var raw struct {
		Signatures []json.RawMessage `json:"signatures"`
	}
	require.NoError(t, json.Unmarshal(served, &raw))
	assert.NotNil(t, raw.Signatures, `the envelope says "signatures": []`)
	assert.Empty(t, raw.Signatures)
	_, pred := statementOf(t, served)
	assert.Equal(t, id, pred.Run.RunID)
	assert.Empty(t, pred.Executor.KeyID, "the predicate names no key")

	stdout, _, code := verifyCmd(t, env, "--key", pub, "--user", env.user, id)
	assert.Equal(t, exitFailure, code, stdout)
	assert.Contains(t, stdout, "unsigned: the envelope has no signature")
	code, body := get(t, serve.url, "/ui/runs/"+id, fleetUserToken)
	require.Equal(t, 200, code, body)
	assert.Contains(t, attestSection(t, body), `data-verdict="unsigned"`)
	log, err := os.ReadFile(w.log.Name())
	require.NoError(t, err)
	assert.Contains(t, string(log), "the run's attestation is unsigned")
}

// TestDaemonRunsAreSigned: `taskrun daemon --attest-key` signs the envelope
// of every run its clients make, succeeded, failed or Ctrl-C cancelled;
// `taskrun verify` passes with its public key and fails with another.
func TestDaemonRunsAreSigned(t *testing.T) {
	e := newCrashEnv(t)
	priv, pub := writeKeyPair(t)
	_, wrongPub := writeKeyPair(t)
	keyID := keyIDOf(t, pub)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"), "--attest-key", priv)
	suffix := strings.ToLower(tenant(t)[:8])
	runs := map[model.RunStatus]string{
		model.StatusSucceeded: "dsig-ok-" + suffix,
		model.StatusFailed:    "dsig-fail-" + suffix,
		model.StatusCancelled: "dsig-intr-" + suffix,
	}
	_, stderr, code := d.runClient(t, 0, "--user", e.user, "--run-id", runs[model.StatusSucceeded], "--image", testImage, "--", "sh", "-c", "echo attested")
	require.Equal(t, exitOK, code, stderr)
	_, stderr, code = d.runClient(t, 0, "--user", e.user, "--run-id", runs[model.StatusFailed], "--image", testImage, "--", "sh", "-c", "echo failing; exit 3")
	require.Equal(t, 3, code, stderr)

	cmd := d.client(t, 0, "--user", e.user, "--run-id", runs[model.StatusCancelled], "--image", testImage, "--", printer[0], printer[1], printer[2])
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var cerr lockedbuf.Buffer
	cmd.Stderr = &cerr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	for i := 0; i < 5 && lines.Scan(); i++ {
	}
	awaitContainerRunning(t, runs[model.StatusCancelled])
	go func() { _, _ = io.Copy(io.Discard, out) }()
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	err = cmd.Wait()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "%s", &cerr)
	require.Equal(t, exitInterrupted, exitErr.ExitCode(), "%s", &cerr)

	for status, id := range runs {
		t.Run(string(status), func(t *testing.T) {
			env := storedEnvelope(t, e, id)
			signers, err := attest.SignedBy(env)
			require.NoError(t, err)
			assert.Equal(t, []string{keyID}, signers)
			_, pred := statementOf(t, env)
			assert.Equal(t, string(status), pred.Outcome.Status)
			stdout, stderr, code := verifyCmd(t, e, "--key", pub, "--user", e.user, id)
			require.Equal(t, exitOK, code, stdout+stderr)
			assert.Contains(t, stdout, "VERIFIED: run "+id+": signed by "+keyID)
			stdout, _, code = verifyCmd(t, e, "--key", wrongPub, "--user", e.user, id)
			assert.Equal(t, exitFailure, code, stdout)
			assert.Contains(t, stdout, "signature: signed by key "+keyID+", not by the given key")
		})
	}
}
