package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/postgres"
	"github.com/taskrun/taskrun/internal/pgtest"
	"github.com/taskrun/taskrun/workerclient"
)

// TestTwoReplicasOnePostgres runs two serve replicas on one real PostgreSQL
// database; many workers long-poll both at once for N runs. No run goes to
// two workers, every run is handed out, and a run whose lease lapses comes
// back with a higher epoch from either replica.
func TestTwoReplicasOnePostgres(t *testing.T) {
	dsn := pgtest.Shared(t).NewDatabase(t)
	ctx := context.Background()
	var reps []*env
	for range 2 {
		st, err := postgres.Open(ctx, dsn)
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		reps = append(reps, newEnv(t, st, nil))
	}
	const runs, workers = 40, 12
	submitted := map[string]bool{}
	for i := range runs {
		sub, err := reps[i%2].user.Submit(ctx, controlplane.SubmitRequest{Prompt: fmt.Sprint("task ", i), Retryable: true}, nil)
		require.NoError(t, err)
		submitted[sub.RunID] = true
	}
	var (
		mu     sync.Mutex
		holder = map[string]string{}
		dups   []string
		wg     sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := reps[w%2].worker
			id := fmt.Sprintf("host-%d", w)
			for {
				a, err := c.AcquireLease(ctx, workerclient.LeaseRequest{WorkerID: id, Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1}, WaitMillis: 50})
				if err != nil || a == nil {
					assert.NoError(t, err)
					return
				}
				mu.Lock()
				if prev, ok := holder[a.Run.ID]; ok {
					dups = append(dups, fmt.Sprintf("%s to %s and %s", a.Run.ID, prev, id))
				}
				holder[a.Run.ID] = id
				mu.Unlock()
				assert.Equal(t, int64(1), a.Lease.Epoch)
			}
		}()
	}
	wg.Wait()
	assert.Empty(t, dups, "a run handed to two workers")
	assert.Len(t, holder, runs)
	for id := range holder {
		assert.True(t, submitted[id])
	}

	// Every lease lapses; replica 1 sweeps, replica 0 hands the runs out again.
	reps[0].clock.Add(20e9)
	reps[1].clock.Add(20e9)
	ex, err := reps[1].srv.SweepOnce(ctx)
	require.NoError(t, err)
	assert.Len(t, ex, runs)
	a := reps[0].lease(t, 0)
	require.NotNil(t, a)
	assert.Equal(t, int64(2), a.Lease.Epoch)
}
