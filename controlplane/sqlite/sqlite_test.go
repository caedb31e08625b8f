package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/sqlite"
	"github.com/taskrun/taskrun/controlplane/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) controlplane.Store {
		s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "cp.db"))
		require.NoError(t, err)
		return s
	})
}

// TestReopenIsIdempotent opens the same file twice: the second open finds the
// schema applied and changes nothing.
func TestReopenIsIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cp.db")
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	require.NoError(t, err)
	storetest.Submit(t, s, "r1", 0, controlplane.TaskSpec{})
	require.NoError(t, s.Close())
	s, err = sqlite.Open(ctx, path)
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Ready(ctx))
	_, err = s.GetRun(ctx, "r1")
	require.NoError(t, err)
}

func BenchmarkLeaseCycle(b *testing.B) {
	s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "cp.db"))
	require.NoError(b, err)
	defer s.Close()
	storetest.BenchLeaseCycle(b, s)
}
