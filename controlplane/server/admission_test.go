package server_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/controlplane/postgres"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/internal/pgtest"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/workerclient"
)

// TestSubmitRefusesWhatNoWorkerRuns: a task no worker could take is
// answered 400 at submission, naming the fix, and no run is created.
func TestSubmitRefusesWhatNoWorkerRuns(t *testing.T) {
	e := newEnv(t, nil, func(c *server.Config) {
		c.Runtimes = []string{"runc", "runsc"}
		c.RunMaxima = runlimits.Maxima{MemoryBytes: 8 << 30, CPUs: 4, DiskBytes: 10 << 30}
	})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  controlplane.SubmitRequest
		says string
	}{
		{"bad image syntax", controlplane.SubmitRequest{Image: "UPPER/Case::bad@@"}, `image "UPPER/Case::bad@@"`},
		{"unknown runtime", controlplane.SubmitRequest{Runtime: "kata"}, `runtime "kata": the workers offer runc, runsc`},
		{"memory over every worker's", controlplane.SubmitRequest{Limits: workerclient.Limits{MemoryBytes: 16 << 30}}, "limits.memory_bytes 17179869184 is over the maximum 8589934592"},
		{"cpus over every worker's", controlplane.SubmitRequest{Limits: workerclient.Limits{CPUs: 4.5}}, "limits.cpus 4.5 is over the maximum 4"},
		{"disk over every worker's", controlplane.SubmitRequest{Limits: workerclient.Limits{DiskBytes: 11 << 30}}, "limits.disk_bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Prompt = "p"
			_, err := e.user.Submit(ctx, tc.req, nil)
			var he *client.HTTPError
			require.True(t, errors.As(err, &he), "%v", err)
			assert.Equal(t, http.StatusBadRequest, he.StatusCode)
			assert.Contains(t, he.Message, tc.says)
		})
	}
	runs, err := e.user.ListRuns(ctx, "", 0)
	require.NoError(t, err)
	assert.Empty(t, runs, "no refused submission created a run")

	for _, ok := range []controlplane.SubmitRequest{
		{Image: "taskrun/agent:local", Runtime: "runsc", Limits: workerclient.Limits{MemoryBytes: 8 << 30, CPUs: 4}},
		{Image: "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{Image: "registry.example.com:5000/team/agent@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
	} {
		ok.Prompt = "p"
		_, err := e.user.Submit(ctx, ok, nil)
		assert.NoError(t, err, "%+v", ok)
	}
}

// TestQueuedRunExpires: a run no worker takes ends FAILED once it waited
// QUEUED past the queue's time to live, saying why, on SQLite and on
// PostgreSQL; a run submitted later stays queued, and without a TTL
// nothing expires.
func TestQueuedRunExpires(t *testing.T) {
	stores := map[string]func(t *testing.T) controlplane.Store{
		"sqlite": func(*testing.T) controlplane.Store { return nil },
		"postgres": func(t *testing.T) controlplane.Store {
			st, err := postgres.Open(context.Background(), pgtest.Shared(t).NewDatabase(t))
			require.NoError(t, err)
			t.Cleanup(func() { st.Close() })
			return st
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, open(t), func(c *server.Config) { c.QueueTTL = time.Hour })
			ctx := context.Background()
			old, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "nobody takes me", Runtime: "gvisor-none"}, nil)
			require.NoError(t, err)
			e.clock.Add(59 * time.Minute)
			young, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "later"}, nil)
			require.NoError(t, err)
			_, err = e.srv.SweepOnce(ctx)
			require.NoError(t, err)
			run, err := e.user.GetRun(ctx, old.RunID)
			require.NoError(t, err)
			assert.Equal(t, model.StatusQueued, run.Status, "59 minutes into a one-hour TTL")

			e.clock.Add(2 * time.Minute)
			_, err = e.srv.SweepOnce(ctx)
			require.NoError(t, err)
			run, err = e.user.GetRun(ctx, old.RunID)
			require.NoError(t, err)
			assert.Equal(t, model.StatusFailed, run.Status)
			assert.Contains(t, run.Error, controlplane.ErrorQueueExpired)
			assert.Contains(t, run.Error, "--queue-ttl")
			run, err = e.user.GetRun(ctx, young.RunID)
			require.NoError(t, err)
			assert.Equal(t, model.StatusQueued, run.Status)
		})
	}
	t.Run("no TTL", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		ctx := context.Background()
		sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
		require.NoError(t, err)
		e.clock.Add(1000 * time.Hour)
		_, err = e.srv.SweepOnce(ctx)
		require.NoError(t, err)
		run, err := e.user.GetRun(ctx, sub.RunID)
		require.NoError(t, err)
		assert.Equal(t, model.StatusQueued, run.Status)
	})
}
