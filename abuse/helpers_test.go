package abuse_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/uidpool"
)

// A taskrun binary alone in an otherwise empty directory runs a task with
// the self-check: it is its own taskrun-probe and taskrun-relay. The sandbox
// sees exactly the two helper files, read-only, and nothing else of the
// directory taskrun was installed in (here a decoy program beside it), and
// the isolation record pins each helper mount to the private copy of the
// binary it came from.
//
// Protection: helpers mounted file by file from a private copy of the
// running binary (package helpers). Mounting the executable's directory, as
// before, shows the decoy inside; without the multi-call entry the run fails
// (no taskrun-probe).
func TestLoneTaskrunBinaryRunsWithOnlyItsHelpersVisible(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	h := newHarness(t)
	install := t.TempDir()
	copyExecutable(t, testbin.Program(t, "./cmd/taskrun"), filepath.Join(install, "taskrun"))
	decoy := filepath.Join(install, "host-admin-tool")
	require.NoError(t, os.WriteFile(decoy, []byte("#!/bin/sh\necho host secret\n"), 0o755))

	root, storeDir := t.TempDir(), t.TempDir()
	script := `ls -la /.taskrun/bin/; echo "== names"; ls /.taskrun/bin/
echo "== write"; (echo x > /.taskrun/bin/taskrun-relay) 2>&1
echo "== relay"; /.taskrun/bin/taskrun-relay -- sh -c 'echo "$OPENAI_BASE_URL"'`
	cmd := exec.Command(filepath.Join(install, "taskrun"), "run",
		"--root", root, "--store", "file://"+storeDir, "--gc=false",
		"--user", h.Tenant, "--conversation", h.ConversationID, "--task", h.TaskID, "--run-id", "lone",
		"--image", testImage, "--", "sh", "-c", script)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output() // the run's stdout; the executor's log goes to stderr
	require.NoError(t, err, "%s\n%s", out, stderr.String())
	output := string(out)

	assert.Equal(t, "taskrun-probe\ntaskrun-relay\n", section(output, "names"), "only the helper files are visible")
	assert.NotContains(t, output, "host-admin-tool")
	assert.Contains(t, section(output, "write"), "Read-only file system")
	assert.Equal(t, "http://127.0.0.1:8411/v1\n", section(output, "relay"), "the relay runs from the multi-call binary")

	store, err := persist.Open(context.Background(), "file://"+storeDir)
	require.NoError(t, err)
	defer store.Close()
	rc, err := store.OpenRunFile(context.Background(), h.Ref("lone"), taskrun.AuditRecordName)
	require.NoError(t, err)
	defer rc.Close()
	raw, err := io.ReadAll(rc)
	require.NoError(t, err)
	rec, err := audit.ParseRecord(raw)
	require.NoError(t, err)
	require.NotNil(t, rec.Probe, "the self-check ran and reported")
	def := uidpool.DefaultRange()
	assert.True(t, rec.Probe.UID >= def.First && rec.Probe.UID <= def.Last, "uid %d leased from --uid-range's default", rec.Probe.UID)
	assert.Empty(t, rec.ProbeContradictions)
	assert.False(t, rec.Recheck().Failed(), "%v", rec.Recheck().FailedIDs())

	pins := rec.Options.Mounts.HelperFiles
	require.Len(t, pins, 2)
	copyPath := pins[helpers.ProbePath]
	assert.Equal(t, copyPath, pins[helpers.RelayPath], "one binary serves both helpers")
	assert.Equal(t, filepath.Join(root, "helpers"), filepath.Dir(filepath.Dir(copyPath)), "a private copy, not the installed binary")
	var helperMounts []string
	for _, m := range rec.Posture.Mounts {
		if strings.HasPrefix(m.Destination, helpers.Dir) {
			helperMounts = append(helperMounts, m.Destination+" <- "+m.Source)
			assert.False(t, m.RW, "%s is read-only", m.Destination)
		}
	}
	assert.ElementsMatch(t, []string{helpers.ProbePath + " <- " + copyPath, helpers.RelayPath + " <- " + copyPath}, helperMounts)
}
