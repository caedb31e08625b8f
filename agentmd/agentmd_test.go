package agentmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBuildRunAgentsMdContentWithoutWorkspaceFile(t *testing.T) {
	home := t.TempDir()
	got, err := BuildRunAgentsMdContent(home)
	require.NoError(t, err)
	assert.Equal(t, RunDirSection, got)
}

func TestBuildRunAgentsMdContentRunSectionComesFirst(t *testing.T) {
	home := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(home, FileName), []byte("Use tabs.\nRun make lint."), 0o644))

	got, err := BuildRunAgentsMdContent(home)
	require.NoError(t, err)

	runIdx := strings.Index(got, "# Run directory")
	ownIdx := strings.Index(got, "Use tabs.")
	require.Equal(t, 0, runIdx, "the run-directory section must open the file")
	require.Greater(t, ownIdx, runIdx, "the workspace's AGENTS.md must follow the run section")
	assert.True(t, strings.HasSuffix(got, "Run make lint.\n"))
}

func TestBuildRunAgentsMdContentMissingHome(t *testing.T) {
	got, err := BuildRunAgentsMdContent(filepath.Join(t.TempDir(), "absent"))
	require.NoError(t, err)
	assert.Equal(t, RunDirSection, got)
}

func TestBuildRunAgentsMdContentRefusesSymlink(t *testing.T) {
	home := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("CANARY-SECRET"), 0o600))
	require.NoError(t, os.Symlink(secret, filepath.Join(home, FileName)))

	got, err := BuildRunAgentsMdContent(home)
	require.ErrorIs(t, err, ErrUnsafeWorkspaceFile)
	assert.NotContains(t, got, "CANARY-SECRET")
}

func TestBuildRunAgentsMdContentRefusesHugeFile(t *testing.T) {
	home := t.TempDir()
	big := strings.Repeat("x", MaxWorkspaceBytes+1)
	require.NoError(t, os.WriteFile(filepath.Join(home, FileName), []byte(big), 0o644))

	_, err := BuildRunAgentsMdContent(home)
	require.ErrorIs(t, err, ErrUnsafeWorkspaceFile)
}

func TestWriteRunAgentsMd(t *testing.T) {
	runDir := t.TempDir()
	home := filepath.Join(runDir, "home")
	require.NoError(t, os.Mkdir(home, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(home, FileName), []byte("workspace rules\n"), 0o644))

	require.NoError(t, WriteRunAgentsMd(runDir, home))

	data, err := os.ReadFile(filepath.Join(runDir, FileName))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(data), RunDirSection))
	assert.Contains(t, string(data), "workspace rules\n")
}

// A resumed run's instructions come from the task's workspace, never from
// the restored home an earlier agent wrote; without a workspace there are
// none.
func TestInstructionsDirOfAResumedRunIsTheWorkspace(t *testing.T) {
	assert.Equal(t, "/home", InstructionsDir("/home", "/ws", false))
	assert.Equal(t, "/ws", InstructionsDir("/home", "/ws", true))
	assert.Empty(t, InstructionsDir("/home", "", true))
	got, err := BuildRunAgentsMdContent("")
	require.NoError(t, err)
	assert.Equal(t, RunDirSection, got)
}
