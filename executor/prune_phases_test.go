package executor_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// Finished runs leave no empty directories under the runs root: neither
// their run directory nor the task, conversation and user directories they
// were the last run of.
func TestPhasesFinishedRunsLeaveNoEmptyDirectories(t *testing.T) {
	u := newUnit(t)
	for _, id := range []string{"empty1", "empty2", "empty3"} {
		in := u.input(id, func(_ context.Context, p *sandboxfake.Process) int {
			write(p.Stdout, "done\n")
			return 0
		})
		in.Task.ID, in.Run.TaskID = "task-"+id, "task-"+id
		rec := &controlplanetest.Recorder{} // each run its own stream
		in.Updater, in.StreamSender = rec, rec
		_, err := executor.Execute(context.Background(), in)
		require.NoError(t, err)
	}
	users := filepath.Join(u.root, "users")
	var empty []string
	require.NoError(t, filepath.WalkDir(users, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || path == users {
			return err
		}
		entries, err := os.ReadDir(path)
		if err == nil && len(entries) == 0 {
			empty = append(empty, path)
		}
		return err
	}))
	assert.Empty(t, empty, "empty directories left under %s", users)
}
