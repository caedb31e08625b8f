package executor_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// newSigner returns a new Ed25519 signing key and its verifier.
func newSigner(t *testing.T) (*attest.Signer, *attest.Verifier) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	require.NoError(t, err)
	s, err := attest.ParseSigner(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	require.NoError(t, err)
	v, err := attest.NewVerifier(pub)
	require.NoError(t, err)
	return s, v
}

// verifyStored verifies the run's stored attestation against the store.
func (u *unit) verifyStored(t *testing.T, runID string, v *attest.Verifier) attest.Result {
	t.Helper()
	ctx := context.Background()
	ref := u.ref(runID)
	prefix, err := persist.RunPrefix(ref)
	require.NoError(t, err)
	listed, err := u.store.List(ctx, prefix)
	require.NoError(t, err)
	env := u.runFile(t, runID, attest.ObjectName)
	require.NotEmpty(t, env, "the run stored no attestation")
	want := attest.Expect{
		Run:      attest.RunIdentity{UserID: ref.UserID, ConversationID: ref.ConversationID, TaskID: ref.TaskID, RunID: runID},
		Prefixes: []string{prefix, "tenants/" + ref.UserID + "/global/"},
		Listed:   listed,
	}
	res, err := attest.Verify(ctx, []byte(env), v, want, func(ctx context.Context, key string) (io.ReadCloser, error) {
		rc, err := u.store.Open(ctx, key)
		if errors.Is(err, persist.ErrNotFound) {
			return nil, fmt.Errorf("%w: %w", attest.ErrMissing, err)
		}
		return rc, err
	})
	require.NoError(t, err)
	return res
}

// Every run that started a container, succeeded, failed or cancelled,
// stores a signed attestation over every object it stored, recording its
// verdict.
func TestPhasesEveryRunIsAttested(t *testing.T) {
	s, v := newSigner(t)
	cases := []struct {
		name   string
		status model.RunStatus
		exit   int
		agent  func(cancel func()) sandboxfake.Program
	}{
		{"succeeded", model.StatusSucceeded, 0, func(func()) sandboxfake.Program {
			return func(_ context.Context, p *sandboxfake.Process) int { write(p.Stdout, "done\n"); return 0 }
		}},
		{"failed", model.StatusFailed, 3, func(func()) sandboxfake.Program {
			return func(_ context.Context, p *sandboxfake.Process) int { write(p.Stderr, "boom\n"); return 3 }
		}},
		{"cancelled", model.StatusCancelled, 0, func(cancel func()) sandboxfake.Program {
			return func(_ context.Context, p *sandboxfake.Process) int {
				write(p.Stdout, "started\n")
				cancel()
				<-p.Terminated()
				return 0
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The cancelled agent exits 0 on SIGTERM: a grace long enough that
			// its exit never races the SIGKILL on a loaded machine.
			u := newUnit(t, sandboxfake.WithMaxStopGrace(time.Minute))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			runID := "attested-" + tc.name
			in := u.input(runID, tc.agent(cancel))
			in.AttestKey = s
			in.Version = "v-test"
			out, _ := executor.Execute(ctx, in)
			require.Equal(t, tc.status, out.Status, out.Reason)

			res := u.verifyStored(t, runID, v)
			require.NoError(t, res.Err())
			envKey, err := persist.RunKey(u.ref(runID), attest.ObjectName)
			require.NoError(t, err)
			var keys []string
			for _, o := range out.Stored {
				keys = append(keys, o.Key)
			}
			assert.Contains(t, keys, envKey)
			assert.Equal(t, len(out.Stored)-1, res.Subjects, "every other stored object is a subject")
			p := res.Predicate
			require.NotNil(t, p)
			assert.Equal(t, string(tc.status), p.Outcome.Status)
			assert.Equal(t, tc.exit, p.Outcome.ExitCode)
			assert.Equal(t, "fake/agent", p.Image.Ref)
			assert.Equal(t, "s1", p.Run.SessionID)
			assert.Equal(t, "v-test", p.Executor.Version)
			assert.NotEmpty(t, p.Policy)
			assert.NotEmpty(t, p.Timings.Phases)
		})
	}
}

// A host without a key stores the statement unsigned, and it says so.
func TestPhasesWithoutAKeyTheAttestationIsUnsigned(t *testing.T) {
	_, v := newSigner(t)
	u := newUnit(t)
	in := u.input("unsigned1", func(_ context.Context, p *sandboxfake.Process) int { return 0 })
	_, err := executor.Execute(context.Background(), in)
	require.NoError(t, err)
	res := u.verifyStored(t, "unsigned1", v)
	require.Len(t, res.Problems, 1)
	assert.Equal(t, attest.ProblemUnsigned, res.Problems[0].Kind)
	require.NotNil(t, res.Predicate)
	assert.Empty(t, res.Predicate.Executor.KeyID)
	assert.Equal(t, res.Subjects, res.Checked, "its subjects still match the store")
}

// A resumed run's attestation names the run it resumed.
func TestPhasesAResumedRunNamesItsParent(t *testing.T) {
	s, v := newSigner(t)
	u := newUnit(t)
	ok := func(_ context.Context, p *sandboxfake.Process) int { return 0 }
	in := u.input("parent1", ok)
	in.AttestKey = s
	_, err := executor.Execute(context.Background(), in)
	require.NoError(t, err)
	in = u.input("child1", ok)
	in.AttestKey = s
	in.Run.PreviousRunID = "parent1"
	_, err = executor.Execute(context.Background(), in)
	require.NoError(t, err)
	res := u.verifyStored(t, "child1", v)
	require.NoError(t, res.Err())
	assert.Equal(t, "parent1", res.Predicate.Run.ParentRunID)
	assert.Empty(t, u.verifyStored(t, "parent1", v).Predicate.Run.ParentRunID)
}
