package workspace_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workspace"
)

func TestPathsLayout(t *testing.T) {
	root := t.TempDir()
	p := workspace.NewPaths(root)
	run := filepath.Join(root, "users", "u1", "conversations", "c1", "tasks", "t1", "runs", "r1")

	assert.Equal(t, filepath.Join(root, "users", "u1", "persistent"), p.PersistentUserDir("u1"))
	assert.Equal(t, run, p.RuntimeTaskRunDir("u1", "c1", "t1", "r1"))
	assert.Equal(t, filepath.Join(run, "home"), p.RuntimeTaskRunHomeDir("u1", "c1", "t1", "r1"))
	assert.Equal(t, filepath.Join(run, "artifacts"), p.RuntimeTaskRunArtifactsDir("u1", "c1", "t1", "r1"))
	assert.Equal(t, filepath.Join(run, "global"), p.RuntimeTaskRunGlobalDir("u1", "c1", "t1", "r1"))
	assert.Equal(t, filepath.Join(run, "output"), p.RunOutputDir("u1", "c1", "t1", "r1"))

	dirs, err := p.Run(model.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"})
	require.NoError(t, err)
	assert.Equal(t, workspace.RunDirs{
		Dir:       run,
		Home:      filepath.Join(run, "home"),
		Artifacts: filepath.Join(run, "artifacts"),
		Global:    filepath.Join(run, "global"),
		Output:    filepath.Join(run, "output"),
	}, dirs)
}

func TestPathsRejectBadIDsBeforeTouchingDisk(t *testing.T) {
	tests := []struct {
		name                string
		user, conv, task, r string
		kind                string
	}{
		{"user escapes", "../other", "c", "t", "r", "user ID"},
		{"conversation slash", "u", "a/b", "t", "r", "conversation ID"},
		{"task dot", "u", "c", ".", "r", "task ID"},
		{"run empty", "u", "c", "t", "", "run ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			p := workspace.NewPaths(root)
			dirs, err := p.Run(model.RunRef{UserID: tt.user, ConversationID: tt.conv, TaskID: tt.task, RunID: tt.r})
			require.ErrorIs(t, err, model.ErrInvalidID)
			assert.Contains(t, err.Error(), tt.kind)
			assert.Equal(t, workspace.RunDirs{}, dirs)
			assert.Empty(t, p.RuntimeTaskRunDir(tt.user, tt.conv, tt.task, tt.r))
			assert.Empty(t, p.RuntimeTaskRunHomeDir(tt.user, tt.conv, tt.task, tt.r))

			err = workspace.CreateRunDirs(dirs, workspace.SandboxOwner)
			require.Error(t, err)
			entries, err := os.ReadDir(root)
			require.NoError(t, err)
			assert.Empty(t, entries, "nothing may be created for invalid IDs")
		})
	}
	assert.Empty(t, workspace.NewPaths(t.TempDir()).PersistentUserDir(".."))
}

func TestCreateRunDirs(t *testing.T) {
	root := t.TempDir()
	dirs, err := workspace.NewPaths(root).Run(model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r"})
	require.NoError(t, err)
	require.NoError(t, workspace.CreateRunDirs(dirs, workspace.SandboxOwner))

	info, err := os.Stat(dirs.Dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), info.Mode().Perm())
	info, err = os.Stat(filepath.Join(root, "users"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), info.Mode().Perm(), "ancestors stay private")

	for _, d := range []string{dirs.Home, dirs.Artifacts, dirs.Global, dirs.Output} {
		info, err := os.Lstat(d)
		require.NoError(t, err)
		require.True(t, info.IsDir())
		uid, gid := ownerOf(t, d)
		if os.Geteuid() == 0 {
			assert.Equal(t, uint32(10001), uid, d)
			assert.Equal(t, uint32(10001), gid, d)
			assert.Equal(t, os.FileMode(0o755), info.Mode().Perm(), d)
		} else {
			assert.Equal(t, os.FileMode(0o777), info.Mode().Perm(), d)
		}
	}
}

func TestCreateRunDirsRefusesReusedRunID(t *testing.T) {
	dirs, err := workspace.NewPaths(t.TempDir()).Run(model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r"})
	require.NoError(t, err)
	require.NoError(t, workspace.CreateRunDirs(dirs, workspace.SandboxOwner))
	writeFile(t, filepath.Join(dirs.Home, "left-over"), "x", 0o644)

	err = workspace.CreateRunDirs(dirs, workspace.SandboxOwner)
	require.ErrorIs(t, err, workspace.ErrRunDirInUse)
	assert.FileExists(t, filepath.Join(dirs.Home, "left-over"))
}

func TestCreateRunDirsAcceptsEmptyExistingRunDir(t *testing.T) {
	dirs, err := workspace.NewPaths(t.TempDir()).Run(model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r"})
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(dirs.Dir, 0o700))
	require.NoError(t, workspace.CreateRunDirs(dirs, workspace.SandboxOwner))
	assert.DirExists(t, dirs.Home)
}
