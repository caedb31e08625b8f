package server_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/postgres"
	"github.com/taskrun/taskrun/controlplane/storetest"
	"github.com/taskrun/taskrun/internal/pgtest"
	"github.com/taskrun/taskrun/workerclient"
)

// benchLeases measures leases handed out over HTTP to 4×GOMAXPROCS
// concurrent workers per replica, from a queue of b.N runs. Each call may
// long-poll: at the queue's tail the last runs can be held by concurrent,
// not yet committed leases.
func benchLeases(b *testing.B, envs []*env) {
	for i := range b.N {
		storetest.Submit(b, envs[0].store, fmt.Sprintf("b%08d", i), i, controlplane.TaskSpec{})
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	b.ResetTimer()
	b.SetParallelism(4 * len(envs)) // 4 × GOMAXPROCS goroutines per replica
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		e := envs[int(n.Add(1))%len(envs)]
		for pb.Next() {
			a, err := e.worker.AcquireLease(context.Background(), workerclient.LeaseRequest{WorkerID: "w",
				Capacity: workerclient.Capacity{Slots: 1, FreeSlots: 1}, WaitMillis: 5000})
			if err != nil || a == nil {
				b.Errorf("lease: %v %v", a, err)
				return
			}
		}
	})
}

func BenchmarkLeaseHTTPSQLite(b *testing.B) {
	benchLeases(b, []*env{newEnv(b, nil, nil)})
}

func BenchmarkLeaseHTTPPostgresTwoReplicas(b *testing.B) {
	dsn := pgtest.Shared(b).NewDatabase(b)
	var envs []*env
	for range 2 {
		st, err := postgres.Open(context.Background(), dsn)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		envs = append(envs, newEnv(b, st, nil))
	}
	benchLeases(b, envs)
}
