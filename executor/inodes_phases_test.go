package executor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// A workspace with more files than its disk cap has inodes fails the run
// with a reason naming the inodes, never "context canceled".
func TestPhasesWorkspaceOverTheCapsInodesSaysSo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for the loop-mounted disk cap")
	}
	u := newUnit(t)
	ws := t.TempDir()
	const size = 16 << 20
	for d := range 10 {
		dir := filepath.Join(ws, fmt.Sprintf("d%d", d))
		require.NoError(t, os.Mkdir(dir, 0o755))
		for i := range size / diskcap.BytesPerInode / 10 * 2 {
			require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), nil, 0o644))
		}
	}
	in := u.input("inodes1", func(context.Context, *sandboxfake.Process) int { return 0 })
	in.Task.WorkspaceDir = ws
	in.DiskLimitBytes = size
	_, err := executor.Execute(context.Background(), in)
	if errors.Is(err, diskcap.ErrUnsupported) {
		t.Skip(err)
	}
	require.Error(t, err)
	var re *executor.RunError
	require.ErrorAs(t, err, &re)
	assert.ErrorIs(t, err, diskcap.ErrNoInodes)
	assert.Contains(t, re.Reason, "inodes")
	assert.NotContains(t, re.Reason, "context canceled")
}
