// Package agentmd builds and writes the AGENTS.md file that tells an agent
// where it is running: the run-directory section comes first, then the
// workspace's own AGENTS.md, if it has one.
package agentmd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/taskrun/taskrun/model"
)

// FileName is the name of the agent instructions file, both in the workspace
// and at the root of the run directory.
const FileName = "AGENTS.md"

// MaxWorkspaceBytes caps how much of the workspace's own AGENTS.md is included.
// The workspace is user content; a huge file must not balloon every run.
const MaxWorkspaceBytes = 256 << 10

// ErrUnsafeWorkspaceFile reports a workspace AGENTS.md that is not a plain file
// of reasonable size; it is refused rather than followed or truncated.
var ErrUnsafeWorkspaceFile = errors.New("unsafe workspace AGENTS.md")

// RunDirSection is the run-directory section: the in-container contract as the
// agent sees it.
const RunDirSection = `# Run directory

You are running inside a sandboxed task run. The run directory is mounted at ` + dir + `:

| path | use |
|---|---|
| ` + dir + `/AGENTS.md | this file: run context (read-only in intent) |
| ` + dir + `/home | your HOME and working directory: the task's workspace; it is saved as session state |
| ` + dir + `/artifacts | put files you deliver here; only regular files are collected |
| ` + dir + `/global | run-global storage; traces go to ` + dir + `/global/traces/<session>/ |
| ` + dir + `/output | write your final answer to ` + dir + `/output/result.md |

The task's prompt is in the file named by $TASKRUN_PROMPT_FILE. Your run is identified by
$TASKRUN_RUN_ID, $TASKRUN_TASK_ID and $TASKRUN_SESSION_ID. The network is off; when a model is
configured it is reachable through the unix socket named by $TASKRUN_MODEL_SOCKET. The root
filesystem is read-only; /tmp is a small scratch space that is not kept.
`

// dir is where the run directory is mounted.
const dir = model.ContainerRunDir

// BuildRunAgentsMdContent returns the content of the run's AGENTS.md: the
// run-directory section first, then, as "Workspace instructions",
// workspaceDir/AGENTS.md if present. workspaceDir must hold what the task's
// submitter wrote, never what an agent did: a fresh run's home before the
// agent starts, or the task's workspace; never a resumed run's home, which
// an earlier agent wrote (see InstructionsDir). An empty workspaceDir
// gives no workspace instructions.
func BuildRunAgentsMdContent(workspaceDir string) (string, error) {
	var b strings.Builder
	b.WriteString(RunDirSection)
	own, err := readWorkspaceAgentsMd(workspaceDir)
	if err != nil {
		return "", err
	}
	if own != "" {
		b.WriteString("\n# Workspace instructions\n\n")
		b.WriteString(own)
		if !strings.HasSuffix(own, "\n") {
			b.WriteString("\n")
		}
	}
	return b.String(), nil
}

// WriteRunAgentsMd writes BuildRunAgentsMdContent(workspaceDir) to
// runDir/AGENTS.md.
func WriteRunAgentsMd(runDir, workspaceDir string) error {
	content, err := BuildRunAgentsMdContent(workspaceDir)
	if err != nil {
		return err
	}
	path := filepath.Join(runDir, FileName)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// InstructionsDir is the directory whose AGENTS.md a run reads as its
// workspace instructions: the home, materialized from the workspace, for a
// fresh run; for a run resuming a session, the task's own workspace
// (workspaceDir, "" for none), because the restored home holds whatever
// the earlier agents wrote, and an AGENTS.md there is theirs, not the
// submitter's.
func InstructionsDir(home, workspaceDir string, resumed bool) string {
	if resumed {
		return workspaceDir
	}
	return home
}

// readWorkspaceAgentsMd reads runHome/AGENTS.md without following a symlink
// (the workspace may come from an earlier, untrusted run) and caps its size.
func readWorkspaceAgentsMd(runHome string) (string, error) {
	if runHome == "" {
		return "", nil
	}
	root, err := os.OpenRoot(runHome)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("open run home %s: %w", runHome, err)
	}
	defer root.Close()
	info, err := root.Lstat(FileName)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("stat workspace %s: %w", FileName, err)
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("%w: %s is not a regular file (mode %s); replace it with a plain file", ErrUnsafeWorkspaceFile, FileName, info.Mode())
	}
	f, err := root.Open(FileName)
	if err != nil {
		return "", fmt.Errorf("open workspace %s: %w", FileName, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxWorkspaceBytes+1))
	if err != nil {
		return "", fmt.Errorf("read workspace %s: %w", FileName, err)
	}
	if len(data) > MaxWorkspaceBytes {
		return "", fmt.Errorf("%w: %s is larger than %d bytes; shorten it", ErrUnsafeWorkspaceFile, FileName, MaxWorkspaceBytes)
	}
	return string(data), nil
}
