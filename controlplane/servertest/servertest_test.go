package servertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/servertest"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// A worker that stops renewing loses its run once the clock passes the
// lease and the sweeper runs.
func TestStartLeaseAdvanceSweep(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	ctx := context.Background()
	sub, err := s.User.Submit(ctx, controlplane.SubmitRequest{Prompt: "p"}, nil)
	require.NoError(t, err)
	w := workerclient.New(s.URL, servertest.WorkerToken)
	a, err := w.AcquireLease(ctx, workerclient.LeaseRequest{WorkerID: "w", Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1}})
	require.NoError(t, err)
	require.NotNil(t, a)
	s.Advance(time.Minute)
	require.Len(t, s.Sweep(t), 1)
	run, err := s.User.GetRun(ctx, sub.RunID)
	require.NoError(t, err)
	assert.Equal(t, model.StatusFailed, run.Status)
	_, err = w.RenewLease(ctx, a.Lease)
	assert.ErrorIs(t, err, workerclient.ErrLeaseLost)
}
