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

// A finished run's empty ancestors go, up to its user's directory; a task
// with another run, and ROOT/users, stay.
func TestPruneRunAncestors(t *testing.T) {
	root := t.TempDir()
	p := workspace.NewPaths(root)
	a, err := p.Run(model.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"})
	require.NoError(t, err)
	b, err := p.Run(model.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r2"})
	require.NoError(t, err)
	require.NoError(t, workspace.CreateRunDir(a))
	require.NoError(t, workspace.CreateRunDir(b))

	require.NoError(t, os.RemoveAll(a.Dir))
	require.NoError(t, workspace.PruneRunAncestors(a.Dir))
	assert.DirExists(t, filepath.Dir(b.Dir), "the task still has a run")

	require.NoError(t, os.RemoveAll(b.Dir))
	require.NoError(t, workspace.PruneRunAncestors(b.Dir))
	assert.NoDirExists(t, filepath.Join(root, "users", "u1"))
	assert.DirExists(t, filepath.Join(root, "users"))

	// Runs start again where the pruned directories were.
	require.NoError(t, workspace.CreateRunDir(a))
	assert.DirExists(t, a.Dir)
}

// A user directory holding more than runs (persistent files) stays.
func TestPruneRunAncestorsKeepsPersistent(t *testing.T) {
	root := t.TempDir()
	p := workspace.NewPaths(root)
	a, err := p.Run(model.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"})
	require.NoError(t, err)
	require.NoError(t, workspace.CreateRunDir(a))
	require.NoError(t, os.MkdirAll(p.PersistentUserDir("u1"), 0o700))
	require.NoError(t, os.RemoveAll(a.Dir))
	require.NoError(t, workspace.PruneRunAncestors(a.Dir))
	assert.NoDirExists(t, filepath.Join(root, "users", "u1", "conversations"))
	assert.DirExists(t, p.PersistentUserDir("u1"))
}

// A directory not laid out as Paths lays out runs is never pruned around.
func TestPruneRunAncestorsElsewhereTouchesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b", "c", "d", "e", "f", "run")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.Remove(dir))
	require.NoError(t, workspace.PruneRunAncestors(dir))
	assert.DirExists(t, filepath.Dir(dir))
}
