package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
)

// labelledImage builds an image from testImage that declares excludes with
// changeset.LabelExclude, and removes it at the end.
func labelledImage(t *testing.T, excludes string) string {
	t.Helper()
	name := fmt.Sprintf("taskrun/testbox-labelled:%d", time.Now().UnixNano())
	cmd := exec.Command("docker", "build", "-q", "-t", name, "--label", "dev.taskrun.test=true", "-")
	cmd.Stdin = strings.NewReader(fmt.Sprintf("FROM %s\nLABEL %s=%q\n", testImage, changeset.LabelExclude, excludes))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "docker build: %s", out)
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", name).Run() })
	return name
}

// runCLI runs taskrun in this process and returns its exit status, stdout and
// stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := dispatch(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestServerRecordsEndToEnd: a run submitted to `taskrun serve` and
// executed by a `taskrun worker` in a real container is read back through
// the control plane by inspect, diff, apply and cp --server, as the store
// serves it locally; its image's dev.taskrun.changes.exclude label keeps its
// cache out of the change set; and inspect, the web interface and taskrun
// audit --record count its isolation rules alike.
func TestServerRecordsEndToEnd(t *testing.T) {
	env := newCrashEnv(t)
	taskrunBin(t)
	image := labelledImage(t, ".cache, **/*.pyc")
	serves := startServeProcs(t, env, "sqlite://"+filepath.Join(t.TempDir(), "cp.db"), 1, fleetLeaseTTL())
	url := serves[0].url
	// The worker offers the labelled image (it pulls none: it is local).
	newWorkerFleet(t, env, url).startOn(url, "", 1, "--labels", "image="+image)
	t.Setenv(envToken, fleetUserToken)

	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "main.go"), []byte("package old\n"), 0o644))
	script := `echo new > added.txt && echo 'package main' > main.go && mkdir -p .cache lib && echo junk > .cache/blob && echo bc > lib/m.pyc`
	code, stdout, stderr := runCLI(t, "submit", "--server", url, "--workspace", ws, "--image", image, "--runtime", "runc",
		"--prompt", "change it", "--", "sh", "-c", script)
	require.Equal(t, exitOK, code, stderr)
	runID := strings.TrimSpace(stdout)
	c, err := client.New(url, fleetUserToken, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), testdeadline.Scale(3*time.Minute))
	defer cancel()
	run, err := c.Wait(ctx, runID, 200*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, model.StatusSucceeded, run.Status, run.Error)
	// The worker stores the record as the run ends; the control plane may
	// hear of the end first.
	require.Eventually(t, func() bool {
		_, err := c.Record(ctx, runID)
		return err == nil
	}, testdeadline.Scale(30*time.Second), 100*time.Millisecond)

	t.Run("diff", func(t *testing.T) {
		code, remote, stderr := runCLI(t, "diff", "--server", url, runID)
		require.Equal(t, exitOK, code, stderr)
		assert.Contains(t, remote, "+++ b/added.txt")
		assert.Contains(t, remote, "+package main")
		assert.NotContains(t, remote, ".cache", "the image's label excludes its cache")
		assert.NotContains(t, remote, ".pyc")
		code, local, stderr := runCLI(t, "diff", "--store", env.store, "--user", env.user, runID)
		require.Equal(t, exitOK, code, stderr)
		assert.Equal(t, local, remote, "the control plane serves the patch the store holds")

		code, list, stderr := runCLI(t, "diff", "--json", "--server", url, runID)
		require.Equal(t, exitOK, code, stderr)
		var set changeset.Set
		require.NoError(t, json.Unmarshal([]byte(list), &set))
		assert.Equal(t, []string{".taskrun-agent", ".cache", "**/*.pyc"}, set.Excluded, "the change set lists every pattern applied")
		assert.Equal(t, 2, set.Summary.Files)
	})

	t.Run("apply", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package old\n"), 0o644))
		code, _, stderr := runCLI(t, "apply", "--server", url, runID, dir)
		require.Equal(t, exitOK, code, stderr)
		b, err := os.ReadFile(filepath.Join(dir, "added.txt"))
		require.NoError(t, err)
		assert.Equal(t, "new\n", string(b))
		b, err = os.ReadFile(filepath.Join(dir, "main.go"))
		require.NoError(t, err)
		assert.Equal(t, "package main\n", string(b))
		assert.NoDirExists(t, filepath.Join(dir, ".cache"))
	})

	t.Run("cp", func(t *testing.T) {
		code, out, stderr := runCLI(t, "cp", "--server", url, runID+":home/added.txt", "-")
		require.Equal(t, exitOK, code, stderr)
		assert.Equal(t, "new\n", out)
		code, out, stderr = runCLI(t, "cp", "--server", url, runID+":changes.json", "-")
		require.Equal(t, exitOK, code, stderr)
		assert.Contains(t, out, `"added.txt"`)
		code, _, stderr = runCLI(t, "cp", "--server", url, runID+":../other/changes.json", "-")
		assert.Equal(t, exitUsage, code, stderr)
		code, _, stderr = runCLI(t, "cp", "--server", url, runID+":workspace.tar.gz", "-")
		assert.Equal(t, exitUsage, code, "the upload is not an object the run stored: %s", stderr)
	})

	t.Run("one isolation count", func(t *testing.T) {
		code, remote, stderr := runCLI(t, "inspect", "--server", url, runID)
		require.Equal(t, exitOK, code, stderr)
		code, local, stderr := runCLI(t, "inspect", "--store", env.store, "--user", env.user, runID)
		require.Equal(t, exitOK, code, stderr)
		assert.Equal(t, local, remote)
		assert.Contains(t, remote, "Changes:       2 files (1 added, 0 deleted, 1 modified")
		tally := regexp.MustCompile(`\d+ passed, \d+ failed, \d+ not applicable`)
		inspected := tally.FindString(remote)
		require.NotEmpty(t, inspected, remote)

		code, js, stderr := runCLI(t, "inspect", "--json", "--server", url, runID)
		require.Equal(t, exitOK, code, stderr)
		var rec runindex.Record
		require.NoError(t, json.Unmarshal([]byte(js), &rec))
		require.NotEmpty(t, rec.Keys.Audit)
		code, audited, stderr := runCLI(t, "audit", "--record", rec.Keys.Audit, "--store", env.store)
		require.Equal(t, exitOK, code, stderr)
		assert.Equal(t, inspected, tally.FindString(audited), "inspect and taskrun audit --record count alike")

		status, page := get(t, url, "/ui/runs/"+runID+"/isolation", fleetUserToken)
		require.Equal(t, 200, status)
		counts := tally.FindAllString(page, -1)
		require.Len(t, counts, 2, "the header's verdict and the table's count")
		assert.Equal(t, inspected, counts[0], "the web interface's header")
		assert.Equal(t, inspected, counts[1], "the web interface's table")
	})
}
