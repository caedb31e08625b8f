package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/images"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/persist/s3test"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/workspace"
)

// shellAgentImage is the reference agent with a busybox shell, so its
// run_command tool can delete, rename and chmod files.
const shellAgentImage = "taskrun/agent-shell-test:local"

func buildShellAgentImage(t *testing.T) string {
	t.Helper()
	busybox, err := exec.LookPath("busybox")
	require.NoError(t, err, "install busybox-static")
	cli, err := images.NewDockerClient()
	require.NoError(t, err)
	defer cli.Close()
	def := images.Definition{
		Ref: shellAgentImage,
		DockerfileText: []byte(`FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
COPY taskrun-agent /usr/local/bin/taskrun-agent
LABEL dev.taskrun.image="agent-shell-test"
USER 10001:10001
WORKDIR /taskrun/home
ENV PATH=/usr/local/bin:/bin
CMD ["/usr/local/bin/taskrun-agent"]
`),
		Files: map[string]string{"busybox": busybox, "taskrun-agent": filepath.Join(testbin.Dir(t), "taskrun-agent")},
	}
	require.NoError(t, images.NewBuilder(cli, io.Discard).Build(context.Background(), def))
	return shellAgentImage
}

// changeScript is a scripted conversation in which the agent edits, adds
// (text and binary), deletes, renames and chmods files.
func changeScript(t *testing.T) string {
	t.Helper()
	type call struct {
		Name      string         `json:"name"`
		Arguments map[string]any `json:"arguments"`
	}
	type line struct {
		Content   string         `json:"content"`
		ToolCalls []call         `json:"tool_calls,omitempty"`
		Usage     map[string]int `json:"usage"`
	}
	usage := map[string]int{"prompt_tokens": 10, "completion_tokens": 5}
	lines := []line{
		{Content: "Editing.\n", Usage: usage, ToolCalls: []call{
			{Name: "write_file", Arguments: map[string]any{"path": "main.go", "content": "package main\n\nfunc main() { println(\"fixed\") }\n"}},
			{Name: "write_file", Arguments: map[string]any{"path": "docs/new.md", "content": "# New\n"}},
			{Name: "write_file", Arguments: map[string]any{"path": "blob.bin", "content": "\x00\x01changed binary\xff"}},
			{Name: "write_file", Arguments: map[string]any{"path": "debug.log", "content": "ignored in a git workspace\n"}},
		}},
		{Content: "Reshaping.\n", Usage: usage, ToolCalls: []call{
			{Name: "run_command", Arguments: map[string]any{"command": "rm doomed.txt && mv old.txt renamed.txt && chmod +x run.sh && chmod -x tool"}},
		}},
		{Content: "Done.\n", Usage: usage},
	}
	var b bytes.Buffer
	for _, l := range lines {
		raw, err := json.Marshal(l)
		require.NoError(t, err)
		b.Write(raw)
		b.WriteByte('\n')
	}
	p := filepath.Join(t.TempDir(), "script.jsonl")
	require.NoError(t, os.WriteFile(p, b.Bytes(), 0o644))
	return p
}

func writeWorkspace(t *testing.T, dir string, git bool) {
	t.Helper()
	files := map[string]struct {
		body string
		mode os.FileMode
	}{
		"main.go":    {"package main\n\nfunc main() { println(\"TODO\") }\n", 0o644},
		"doomed.txt": {"delete me\n", 0o644},
		"old.txt":    {"rename me\n", 0o644},
		"run.sh":     {"#!/bin/sh\necho run\n", 0o644},
		"tool":       {"#!/bin/sh\necho tool\n", 0o755},
		"blob.bin":   {"\x00\x01binary", 0o644},
		".gitignore": {"*.log\n", 0o644},
	}
	for name, f := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(f.body), f.mode))
		require.NoError(t, os.Chmod(p, f.mode))
	}
	if git {
		for _, args := range [][]string{{"init", "-q", "."}, {"add", "-A"}, {"commit", "-q", "-m", "base"}} {
			cmd := exec.Command("git", args...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
				"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
		}
	}
}

// fileTree maps each file and symlink under dir (outside .git and skipped
// paths) to its git mode and content digest.
func fileTree(t *testing.T, dir string, skip func(string) bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	_, err := workspace.Scan(context.Background(), dir, workspace.ScanOptions{Exclude: func(rel string) bool {
		return filepath.Base(rel) == ".git" || skip(rel)
	}}, func(_ context.Context, e workspace.ScanEntry) error {
		if e.Reader == nil {
			out[e.RelPath] = "120000 " + e.Target
			return nil
		}
		h := sha256.New()
		if _, err := io.Copy(h, e.Reader); err != nil {
			return err
		}
		mode := "100644 "
		if e.Mode.Perm()&0o111 != 0 {
			mode = "100755 "
		}
		out[e.RelPath] = mode + hex.EncodeToString(h.Sum(nil))
		return nil
	})
	require.NoError(t, err)
	return out
}

// The reference agent changes a git workspace and a plain directory; the
// stored patch, applied with git apply to a fresh copy of the original,
// gives the run's final home, and the inspection commands read the run back
// (from file:// and from S3).
func TestChangeSetEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real containers")
	}
	img := buildShellAgentImage(t)
	script := changeScript(t)
	for _, tc := range []struct {
		name  string
		git   bool
		store func(t *testing.T) string
	}{
		{"git-workspace-file-store", true, func(t *testing.T) string { return "file://" + filepath.Join(t.TempDir(), "store") }},
		{"plain-directory-s3-store", false, func(t *testing.T) string { return s3test.Start(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := t.TempDir()
			writeWorkspace(t, orig, tc.git)
			root, store, user, runID := t.TempDir(), tc.store(t), tenant(t), "chg-"+tenant(t)
			args := []string{"run", "--workspace", orig, "--prompt", "change things", "--model", "scripted:" + script,
				"--image", img, "--root", root, "--store", store, "--user", user, "--run-id", runID,
				"--helpers-dir", testbin.Dir(t), "--gc=false", "--keep", "--json"}
			excluded := changeset.DefaultExcludes
			if !tc.git {
				// Where no .gitignore applies, the run leaves the log out.
				args = append(args, "--change-exclude", "debug.log")
				excluded = append(slices.Clone(excluded), "debug.log")
			}
			runOut, stderr, code := taskrunCmd(args...)
			require.Equal(t, exitOK, code, stderr)
			var res jsonResult
			require.NoError(t, json.Unmarshal([]byte(runOut), &res))
			require.NotNil(t, res.Changes, "--json names the change set")
			home := taskrun.NewRuntimePathsFromRoot(root).RuntimeTaskRunHomeDir(user, defaultConversation, defaultTask, runID)

			patch, stderr, code := taskrunCmd("diff", "--store", store, runID)
			require.Equal(t, exitOK, code, stderr)
			fresh := t.TempDir()
			_, err := workspace.CopyTree(context.Background(), orig, fresh, workspace.CopyOptions{})
			require.NoError(t, err)
			apply := exec.Command("git", "apply", "-")
			apply.Dir, apply.Stdin = fresh, strings.NewReader(patch)
			out, err := apply.CombinedOutput()
			require.NoError(t, err, "git apply: %s\n%s", out, patch)

			// The agent's own state is in the home but not in the patch.
			require.DirExists(t, filepath.Join(home, ".taskrun-agent"))
			assert.NotContains(t, patch, ".taskrun-agent")
			ignored := func(rel string) bool { return rel == "debug.log" || rel == ".taskrun-agent" }
			assert.Equal(t, fileTree(t, home, ignored), fileTree(t, fresh, ignored), "patched copy equals the final home")

			js, stderr, code := taskrunCmd("diff", "--store", store, "--json", runID)
			require.Equal(t, exitOK, code, stderr)
			var set changeset.Set
			require.NoError(t, json.Unmarshal([]byte(js), &set))
			kinds := map[string]changeset.Kind{}
			for _, c := range set.Changes {
				kinds[c.Path] = c.Kind
			}
			assert.Equal(t, changeset.Modified, kinds["main.go"])
			assert.Equal(t, changeset.Added, kinds["docs/new.md"])
			assert.Equal(t, changeset.Modified, kinds["blob.bin"])
			assert.Equal(t, changeset.Deleted, kinds["doomed.txt"])
			assert.Equal(t, changeset.Renamed, kinds["renamed.txt"])
			assert.Equal(t, changeset.ModeChanged, kinds["run.sh"])
			assert.Equal(t, changeset.ModeChanged, kinds["tool"])
			assert.Equal(t, tc.git, set.Git)
			assert.NotContains(t, kinds, "debug.log")
			assert.Equal(t, excluded, set.Excluded, "changes.json lists what was left out")
			for p := range kinds {
				assert.NotContains(t, p, ".taskrun-agent")
			}
			if tc.git {
				assert.Len(t, set.BaseCommit, 40)
			}

			runs, stderr, code := taskrunCmd("runs", "--store", store, "--user", user, "--json")
			require.Equal(t, exitOK, code, stderr)
			var recs []runindex.Record
			require.NoError(t, json.Unmarshal([]byte(runs), &recs))
			require.Len(t, recs, 1)
			rec := recs[0]
			assert.Equal(t, runID, rec.RunID)
			assert.EqualValues(t, "SUCCEEDED", rec.Status)
			assert.Equal(t, set.TreeHash, rec.Changes.TreeHash)
			assert.Equal(t, "taskrun-"+runID, rec.ContainerName)
			assert.Equal(t, res.Changes.Patch.Key, rec.Keys.Patch)
			assert.Equal(t, res.Changes.List.Key, rec.Keys.Changes)
			storedKeys := map[string]bool{}
			for _, o := range res.Stored {
				storedKeys[o.Key] = true
			}
			assert.True(t, storedKeys[rec.Keys.Patch] && storedKeys[rec.Keys.Changes], "--json lists the change set among the stored keys")
			assert.NotEmpty(t, rec.Keys.State)

			logs, stderr, code := taskrunCmd("logs", "--store", store, runID)
			require.Equal(t, exitOK, code, stderr)
			assert.Contains(t, logs, "Done.")

			got, stderr, code := taskrunCmd("cp", "--store", store, runID+":home/main.go", "-")
			require.Equal(t, exitOK, code, stderr)
			assert.Contains(t, got, "fixed")

			info, stderr, code := taskrunCmd("inspect", "--store", store, runID)
			require.Equal(t, exitOK, code, stderr)
			assert.Contains(t, info, "SUCCEEDED")
			assert.Contains(t, info, "changes.patch")
		})
	}
}

// scriptOf writes a scripted conversation whose first turn runs command
// with the agent's shell tool and whose second ends the run.
func scriptOf(t *testing.T, command string) string {
	t.Helper()
	usage := `"usage":{"prompt_tokens":10,"completion_tokens":5}`
	cmd, err := json.Marshal(command)
	require.NoError(t, err)
	body := `{"content":"Working.\n",` + usage + `,"tool_calls":[{"name":"run_command","arguments":{"command":` + string(cmd) + `}}]}` + "\n" +
		`{"content":"Done.\n",` + usage + "}\n"
	p := filepath.Join(t.TempDir(), "script.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

// An agent under a 64 MiB disk cap leaves four 256 GiB sparse files: a
// terabyte of holes that, hashed, would hold the run past its storing
// deadline. The run succeeds, and its change set lists them as changed
// without a digest, with the reason.
func TestSparseFilesUnderDiskCapEndWithAChangeSet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real containers")
	}
	img := buildShellAgentImage(t)
	script := scriptOf(t, "for i in 0 1 2 3; do truncate -s 256G hole$i || exit 1; done; echo small > small.txt")
	orig := t.TempDir()
	writeWorkspace(t, orig, false)
	root, store, user, runID := t.TempDir(), "file://"+filepath.Join(t.TempDir(), "store"), tenant(t), "sparse-"+tenant(t)
	runOut, stderr, code := taskrunCmd("run", "--workspace", orig, "--prompt", "make holes", "--model", "scripted:"+script,
		"--image", img, "--root", root, "--store", store, "--user", user, "--run-id", runID, "--disk", "64m",
		"--helpers-dir", testbin.Dir(t), "--gc=false", "--json")
	require.Equal(t, exitOK, code, stderr)
	var res jsonResult
	require.NoError(t, json.Unmarshal([]byte(runOut), &res))
	assert.EqualValues(t, "SUCCEEDED", res.Status)
	require.NotNil(t, res.Changes, "the change set was recorded")

	js, stderr, code := taskrunCmd("diff", "--store", store, "--json", runID)
	require.Equal(t, exitOK, code, stderr)
	var set changeset.Set
	require.NoError(t, json.Unmarshal([]byte(js), &set))
	byPath := map[string]changeset.Change{}
	for _, c := range set.Changes {
		byPath[c.Path] = c
	}
	for i := range 4 {
		c := byPath["hole"+string(rune('0'+i))]
		assert.Equal(t, changeset.Added, c.Kind)
		assert.Equal(t, int64(256<<30), c.NewSize)
		assert.Empty(t, c.NewSHA256)
		assert.Contains(t, c.NotHashed, "sparse file")
	}
	assert.Equal(t, changeset.Added, byPath["small.txt"].Kind)
	assert.NotEmpty(t, byPath["small.txt"].NewSHA256)
	assert.Equal(t, 4, set.Summary.NotHashed)
}
