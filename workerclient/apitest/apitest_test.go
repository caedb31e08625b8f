package apitest_test

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/postgres"
	"github.com/taskrun/taskrun/controlplane/servertest"
	"github.com/taskrun/taskrun/internal/pgtest"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/apitest"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The fake control plane the worker's tests use.
func TestFake(t *testing.T) {
	apitest.Run(t, func(t *testing.T) apitest.ControlPlane { return newFake(t) })
}

// The reference server on SQLite.
func TestServerSQLite(t *testing.T) {
	apitest.Run(t, func(t *testing.T) apitest.ControlPlane {
		return &real{s: servertest.Start(t, servertest.Options{LeaseTTL: leaseTTL})}
	})
}

// The reference server on PostgreSQL (skipped without PostgreSQL).
func TestServerPostgres(t *testing.T) {
	c := pgtest.Shared(t)
	apitest.Run(t, func(t *testing.T) apitest.ControlPlane {
		st, err := postgres.Open(context.Background(), c.NewDatabase(t))
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		return &real{s: servertest.Start(t, servertest.Options{Store: st, LeaseTTL: leaseTTL})}
	})
}

// leaseTTL is long, so that no lease lapses by itself while a case runs
// on a slow machine: only Advance moves past it.
const leaseTTL = 15 * time.Second

// real adapts servertest to the suite.
type real struct {
	s *servertest.Server
}

func (r *real) URL() string { return r.s.URL }

func (r *real) WorkerToken(i int) string {
	if i == 0 {
		return servertest.WorkerToken
	}
	return servertest.OtherWorkerToken
}

func (r *real) LeaseTTL() time.Duration { return leaseTTL }
func (r *real) Now() time.Time          { return r.s.Now() }

func (r *real) Submit(t *testing.T, s apitest.Spec) string {
	sub, err := r.s.User.Submit(context.Background(), controlplane.SubmitRequest{Prompt: "p", Image: s.Image, Runtime: s.Runtime,
		Limits: workerclient.Limits{MemoryBytes: s.MemoryBytes}, Retryable: s.Retryable}, nil)
	require.NoError(t, err)
	// Runs are leased oldest first at millisecond resolution: keep the
	// submissions apart on the server's (frozen) clock.
	r.s.Advance(time.Millisecond)
	return sub.RunID
}

func (r *real) Cancel(t *testing.T, runID string) {
	_, err := r.s.User.Cancel(context.Background(), runID)
	require.NoError(t, err)
}

func (r *real) Advance(t *testing.T, d time.Duration) {
	r.s.Advance(d)
	r.s.Sweep(t)
}

func (r *real) Run(t *testing.T, runID string) apitest.RunState {
	ctx := context.Background()
	run, err := r.s.User.GetRun(ctx, runID)
	require.NoError(t, err)
	out, err := r.s.User.Output(ctx, runID, 0, false)
	require.NoError(t, err)
	defer out.Close()
	data, err := io.ReadAll(out)
	require.NoError(t, err)
	return apitest.RunState{Status: run.Status, Error: run.Error, Epoch: run.Epoch, Output: data, StreamEnded: run.StreamEnded}
}

// fake adapts controlplanetest to the suite.
type fake struct {
	cp *controlplanetest.ControlPlane
	n  int
}

const (
	fakeToken      = "apitest-worker-token-0123456789"
	fakeOtherToken = "apitest-other-worker-token-01234"
)

func newFake(t *testing.T) *fake {
	cp := controlplanetest.New(t, fakeToken)
	cp.AddWorkerToken(fakeOtherToken)
	cp.SetLeaseTiming(leaseTTL, leaseTTL/3)
	// Runs after New's: the stream violations the suite provokes on
	// purpose are claimed (each is checked as a 409 by the suite).
	t.Cleanup(func() { cp.Violations() })
	return &fake{cp: cp}
}

func (f *fake) URL() string { return f.cp.URL() }

func (f *fake) WorkerToken(i int) string {
	if i == 0 {
		return fakeToken
	}
	return fakeOtherToken
}

func (f *fake) LeaseTTL() time.Duration { return leaseTTL }
func (f *fake) Now() time.Time          { return f.cp.Now() }

func (f *fake) Submit(_ *testing.T, s apitest.Spec) string {
	f.n++
	id := "run-" + string(rune('a'+f.n))
	f.cp.Enqueue(workerclient.Assignment{
		Task:      model.Task{ID: "t" + id, UserID: "u", ConversationID: "c", Prompt: "p"},
		Run:       model.TaskRun{ID: id, TaskID: "t" + id},
		SessionID: "s",
		Image:     s.Image, Runtime: s.Runtime,
		Limits:    workerclient.Limits{MemoryBytes: s.MemoryBytes},
		Retryable: s.Retryable,
	})
	return id
}

func (f *fake) Cancel(_ *testing.T, runID string) {
	f.cp.CancelRun(runID)
}

func (f *fake) Advance(_ *testing.T, d time.Duration) { f.cp.Advance(d) }

func (f *fake) Run(t *testing.T, runID string) apitest.RunState {
	info := f.cp.Lease(runID)
	data, ended, _ := f.cp.Stream(runID)
	st := apitest.RunState{Status: info.Status, Error: info.Reason, Epoch: info.Epoch, Output: data, StreamEnded: ended}
	if st.Status == "" {
		st.Status = info.Current
	}
	if st.Status == "" {
		t.Fatalf("the fake does not know run %s", runID)
	}
	return st
}
