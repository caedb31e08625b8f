package postgres_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/postgres"
	"github.com/taskrun/taskrun/controlplane/storetest"
	"github.com/taskrun/taskrun/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func open(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), dsn)
	require.NoError(t, err)
	return s
}

func TestConformance(t *testing.T) {
	c := pgtest.Shared(t)
	storetest.Run(t, func(t *testing.T) controlplane.Store { return open(t, c.NewDatabase(t)) })
}

// TestReplicasMigrateAtOnce starts several stores on one empty database at
// the same moment: the advisory lock lets one apply the schema, the others
// find it applied.
func TestReplicasMigrateAtOnce(t *testing.T) {
	dsn := pgtest.Shared(t).NewDatabase(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	stores := make([]*postgres.Store, 4)
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stores[i], errs[i] = postgres.Open(context.Background(), dsn)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "replica %d", i)
		require.NoError(t, stores[i].Ready(context.Background()))
		defer stores[i].Close()
	}
}

// TestTwoReplicasNeverShareARun has two stores (two replicas' pools) on one
// database hand out N runs to many concurrent callers: each run goes to one
// caller, with epoch 1; after expiry and requeue the epochs grow.
func TestTwoReplicasNeverShareARun(t *testing.T) {
	dsn := pgtest.Shared(t).NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	defer a.Close()
	defer b.Close()
	const n = 60
	for i := range n {
		storetest.Submit(t, a, fmt.Sprintf("r%03d", i), i, controlplane.TaskSpec{Retryable: true})
	}
	now := time.UnixMilli(1767225600000)
	got := storetest.LeaseConcurrently(t, []controlplane.Store{a, b}, 24, now)
	assert.Len(t, got, n)

	ex, err := b.ExpireLeases(context.Background(), now.Add(time.Hour))
	require.NoError(t, err)
	assert.Len(t, ex, n)
	r, err := a.Lease(context.Background(), controlplane.LeaseOffer{Holder: "w", TokenHash: sha256.Sum256([]byte("t")), WorkerID: "w", Now: now.Add(time.Hour), TTL: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, r)
	assert.Equal(t, int64(2), r.Epoch)
}

func BenchmarkLeaseCycle(b *testing.B) {
	s := open2(b, pgtest.Shared(b).NewDatabase(b))
	defer s.Close()
	storetest.BenchLeaseCycle(b, s)
}

func open2(tb testing.TB, dsn string) *postgres.Store {
	s, err := postgres.Open(context.Background(), dsn)
	require.NoError(tb, err)
	return s
}
