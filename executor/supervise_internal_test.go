package executor

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/workspace"
)

// Where no capped filesystem can be mounted, the watchdog stops a run whose
// directory outgrows the cap, and the run fails with ErrDiskLimit.
func TestWatchDiskStopsRunOverCap(t *testing.T) {
	dir := t.TempDir()
	p := &plan{limits: limits{disk: 1 << 20}, log: slog.Default(), dirs: workspace.RunDirs{Dir: dir}}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	end := watchDisk(context.Background(), p, &workdir{}, stop)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fill"), make([]byte, 4<<20), 0o644))

	<-ctx.Done() // the watchdog stopped the run
	err := end()
	require.ErrorIs(t, err, ErrDiskLimit)
}

func TestWatchDiskQuietUnderCap(t *testing.T) {
	p := &plan{limits: limits{disk: 64 << 20}, log: slog.Default(), dirs: workspace.RunDirs{Dir: t.TempDir()}}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	end := watchDisk(context.Background(), p, &workdir{}, stop)
	assert.NoError(t, end())
	assert.NoError(t, ctx.Err())
}
