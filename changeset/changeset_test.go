package changeset_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/workspace"
)

func write(t *testing.T, dir, rel, content string, mode fs.FileMode) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), mode))
	require.NoError(t, os.Chmod(p, mode))
}

func symlink(t *testing.T, dir, rel, target string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.Symlink(target, p))
}

func binary(seed byte, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	b[3] = 0
	return string(b)
}

func lines(n int, tag string) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(tag)
		b.WriteString(strings.Repeat("x", i%5))
		b.WriteString("\n")
	}
	return b.String()
}

// copyTree copies src to a fresh directory with the project's safe copier.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	_, err := workspace.CopyTree(context.Background(), src, dst, workspace.CopyOptions{})
	require.NoError(t, err)
	return dst
}

// treeOf maps each file and symlink under dir (outside .git and paths
// skip rejects) to its git-style mode and content.
func treeOf(t *testing.T, dir string, skip func(string) bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	_, err := workspace.Scan(context.Background(), dir, workspace.ScanOptions{Exclude: func(rel string) bool {
		return filepath.Base(rel) == ".git" || (skip != nil && skip(rel))
	}}, func(_ context.Context, e workspace.ScanEntry) error {
		if e.Reader == nil {
			out[e.RelPath] = "symlink:" + e.Target
			return nil
		}
		b, err := io.ReadAll(e.Reader)
		if err != nil {
			return err
		}
		mode := "100644"
		if e.Mode.Perm()&0o111 != 0 {
			mode = "100755"
		}
		h := sha256.Sum256(b)
		out[e.RelPath] = mode + ":" + hex.EncodeToString(h[:])
		return nil
	})
	require.NoError(t, err)
	return out
}

func gitCmd(t *testing.T, dir string, stdin []byte, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return string(out)
}

// run snapshots home, lets mutate change it, and computes the change set.
func run(t *testing.T, home string, opts changeset.Options, mutate func()) (*changeset.Set, []byte) {
	t.Helper()
	ctx := context.Background()
	base := filepath.Join(t.TempDir(), "base")
	require.NoError(t, changeset.Snapshot(ctx, home, base, opts))
	mutate()
	var patch bytes.Buffer
	set, err := changeset.Compute(ctx, base, home, &patch)
	require.NoError(t, err)
	return set, patch.Bytes()
}

// applies checks that git apply turns a fresh copy of orig into a tree equal
// to home (outside skip).
func applies(t *testing.T, orig, home string, patch []byte, skip func(string) bool) {
	t.Helper()
	fresh := copyTree(t, orig)
	if len(patch) > 0 {
		gitCmd(t, fresh, patch, "apply", "--whitespace=nowarn", "-")
	}
	assert.Equal(t, treeOf(t, home, skip), treeOf(t, fresh, skip))
}

func byPath(set *changeset.Set) map[string]changeset.Change {
	m := map[string]changeset.Change{}
	for _, c := range set.Changes {
		m[c.Path] = c
	}
	return m
}

// plainTree fills dir with the starting tree the tests change.
func plainTree(t *testing.T, dir string) {
	write(t, dir, "src/main.go", lines(40, "line"), 0o644)
	write(t, dir, "src/noeol.txt", "a\nb\nc", 0o644)
	write(t, dir, "doomed.txt", "bye\n", 0o644)
	write(t, dir, "gone/a.txt", "a\n", 0o644)
	write(t, dir, "gone/b.txt", "b\n", 0o644)
	write(t, dir, "old name.txt", lines(10, "moved"), 0o644)
	write(t, dir, "run.sh", "#!/bin/sh\necho hi\n", 0o644)
	write(t, dir, "tool", "#!/bin/sh\n", 0o755)
	write(t, dir, "image.bin", binary(1, 3000), 0o644)
	write(t, dir, "empty-doomed", "", 0o644)
	symlink(t, dir, "link", "src/main.go")
	symlink(t, dir, "becomes-file", "run.sh")
	write(t, dir, "becomes-link", "text\n", 0o644)
}

func mutatePlain(t *testing.T, home string) {
	main := strings.Split(lines(40, "line"), "\n")
	main[5] = "changed five"
	main[30] = "changed thirty"
	write(t, home, "src/main.go", strings.Join(main, "\n")+"extra\n", 0o644)
	write(t, home, "src/noeol.txt", "a\nB\nc\nd", 0o644)
	require.NoError(t, os.Remove(filepath.Join(home, "doomed.txt")))
	require.NoError(t, os.RemoveAll(filepath.Join(home, "gone")))
	require.NoError(t, os.Rename(filepath.Join(home, "old name.txt"), filepath.Join(home, "new\tname ü.txt")))
	require.NoError(t, os.Chmod(filepath.Join(home, "run.sh"), 0o755))
	require.NoError(t, os.Chmod(filepath.Join(home, "tool"), 0o644))
	write(t, home, "image.bin", binary(2, 4000), 0o644)
	write(t, home, "assets/new.bin", binary(3, 500), 0o755)
	write(t, home, "deep/er/new.txt", "hello\n", 0o644)
	write(t, home, "empty-new", "", 0o644)
	require.NoError(t, os.Remove(filepath.Join(home, "empty-doomed")))
	require.NoError(t, os.Remove(filepath.Join(home, "link")))
	symlink(t, home, "link", "src/noeol.txt")
	symlink(t, home, "newlink", "../outside/of/tree")
	require.NoError(t, os.Remove(filepath.Join(home, "becomes-file")))
	write(t, home, "becomes-file", "now a file\n", 0o644)
	require.NoError(t, os.Remove(filepath.Join(home, "becomes-link")))
	symlink(t, home, "becomes-link", "tool")
}

func TestPlainDirectoryPatchAppliesWithGit(t *testing.T) {
	orig := t.TempDir()
	plainTree(t, orig)
	home := copyTree(t, orig)
	set, patch := run(t, home, changeset.Options{Workspace: orig}, func() { mutatePlain(t, home) })

	applies(t, orig, home, patch, nil)

	ch := byPath(set)
	assert.Equal(t, changeset.Modified, ch["src/main.go"].Kind)
	assert.Equal(t, 3, ch["src/main.go"].Insertions)
	assert.Equal(t, 2, ch["src/main.go"].Deletions)
	assert.Equal(t, changeset.Deleted, ch["doomed.txt"].Kind)
	assert.Equal(t, changeset.Deleted, ch["gone/a.txt"].Kind)
	assert.Equal(t, changeset.Renamed, ch["new\tname ü.txt"].Kind)
	assert.Equal(t, "old name.txt", ch["new\tname ü.txt"].OldPath)
	assert.Equal(t, changeset.ModeChanged, ch["run.sh"].Kind)
	assert.Equal(t, "100755", ch["run.sh"].NewMode)
	assert.Equal(t, changeset.ModeChanged, ch["tool"].Kind)
	assert.True(t, ch["image.bin"].Binary)
	assert.Equal(t, int64(4000), ch["image.bin"].NewSize)
	assert.Equal(t, changeset.Added, ch["assets/new.bin"].Kind)
	assert.Equal(t, changeset.Modified, ch["link"].Kind)
	assert.Equal(t, "120000", ch["newlink"].NewMode)
	assert.Equal(t, changeset.TypeChanged, ch["becomes-file"].Kind)
	assert.Equal(t, changeset.TypeChanged, ch["becomes-link"].Kind)
	assert.Equal(t, changeset.Added, ch["empty-new"].Kind)
	assert.Equal(t, changeset.Deleted, ch["empty-doomed"].Kind)
	assert.Equal(t, changeset.Modified, ch["src/noeol.txt"].Kind)
	assert.Equal(t, 0, set.Summary.Omitted)
	assert.Equal(t, len(set.Changes), set.Summary.Files)
	assert.Equal(t, int64(len(patch)), set.Summary.PatchBytes)
	sum := sha256.Sum256(patch)
	assert.Equal(t, hex.EncodeToString(sum[:]), set.PatchSHA256)
	assert.Empty(t, set.BaseCommit)
	assert.False(t, set.Git)
	assert.Contains(t, string(patch), "GIT binary patch")
	assert.Contains(t, string(patch), "rename from old name.txt\nrename to \"new\\tname \\303\\274.txt\"\n")
}

func TestUnchangedTreeHasEmptyPatchAndStableHash(t *testing.T) {
	orig := t.TempDir()
	plainTree(t, orig)
	home := copyTree(t, orig)
	set, patch := run(t, home, changeset.Options{}, func() {})
	assert.Empty(t, patch)
	assert.Empty(t, set.Changes)

	other := copyTree(t, orig)
	set2, _ := run(t, other, changeset.Options{}, func() {})
	assert.Equal(t, set.TreeHash, set2.TreeHash)

	set3, _ := run(t, other, changeset.Options{}, func() {
		require.NoError(t, os.Chmod(filepath.Join(other, "tool"), 0o644))
	})
	assert.NotEqual(t, set.TreeHash, set3.TreeHash, "a mode change changes the tree hash")
}

func TestGitWorkspaceAgainstBaseCommitHonoursGitignore(t *testing.T) {
	orig := t.TempDir()
	gitCmd(t, orig, nil, "init", "-q", ".")
	write(t, orig, ".gitignore", "build/\n*.log\n", 0o644)
	write(t, orig, "app.py", lines(20, "print"), 0o644)
	write(t, orig, "keep.log", "tracked although ignored\n", 0o644)
	write(t, orig, "bin/run", "#!/bin/sh\n", 0o755)
	write(t, orig, "data.bin", binary(9, 100), 0o644)
	gitCmd(t, orig, nil, "add", "-A")
	gitCmd(t, orig, nil, "add", "-f", "keep.log")
	gitCmd(t, orig, nil, "commit", "-q", "-m", "base")
	head := strings.TrimSpace(gitCmd(t, orig, nil, "rev-parse", "HEAD"))
	write(t, orig, "build/stale.o", "old object\n", 0o644) // ignored at start

	home := copyTree(t, orig)
	pwned := filepath.Join(t.TempDir(), "pwned")
	set, patch := run(t, home, changeset.Options{Workspace: orig}, func() {
		write(t, home, "app.py", lines(21, "print"), 0o644)
		write(t, home, "keep.log", "tracked, changed\n", 0o644)
		write(t, home, "debug.log", "ignored new file\n", 0o644)
		write(t, home, "build/out.o", "ignored build output\n", 0o644)
		write(t, home, "build/stale.o", "ignored, changed\n", 0o644)
		write(t, home, "notes/todo.md", "untracked new file\n", 0o644)
		// An agent cannot hide a new file by editing the ignore rules.
		write(t, home, ".gitignore", "build/\n*.log\nsecret.txt\n", 0o644)
		write(t, home, "secret.txt", "still in the patch\n", 0o644)
		require.NoError(t, os.Rename(filepath.Join(home, "bin/run"), filepath.Join(home, "bin/start")))
		write(t, home, "data.bin", binary(10, 100), 0o755)
		// The agent owns the home's .git; it is neither diffed nor run.
		write(t, home, ".git/config", "[core]\n\tfsmonitor = \"touch "+pwned+"\"\n\thooksPath = .git/hooks\n", 0o644)
		write(t, home, ".git/hooks/post-checkout", "#!/bin/sh\ntouch "+pwned+"\n", 0o755)
	})
	assert.NoFileExists(t, pwned, "git ran with the agent's repository configuration")
	assert.True(t, set.Git)
	assert.Equal(t, head, set.BaseCommit)
	ch := byPath(set)
	assert.Contains(t, ch, "notes/todo.md")
	assert.Contains(t, ch, "secret.txt")
	assert.Contains(t, ch, "keep.log", "a tracked file is never ignored")
	assert.NotContains(t, ch, "debug.log")
	assert.NotContains(t, ch, "build/out.o")
	assert.NotContains(t, ch, "build/stale.o")
	assert.Equal(t, 3, set.Ignored)
	assert.Equal(t, changeset.Renamed, ch["bin/start"].Kind)
	for p := range ch {
		assert.False(t, strings.HasPrefix(p, ".git/"), p)
	}

	ignored := func(rel string) bool {
		return rel == "build" || strings.HasSuffix(rel, ".log") && rel != "keep.log"
	}
	applies(t, orig, home, patch, ignored)

	// The patch also applies to a fresh checkout of the base commit.
	clone := t.TempDir()
	gitCmd(t, clone, nil, "clone", "-q", orig, ".")
	gitCmd(t, clone, patch, "apply", "--index", "-")
	assert.Equal(t, treeOf(t, home, ignored), treeOf(t, clone, ignored))
}

func TestHostileHomeIsBounded(t *testing.T) {
	orig := t.TempDir()
	write(t, orig, "a.txt", "a\n", 0o644)
	write(t, orig, "big-before", strings.Repeat("z", 2000), 0o644)
	home := copyTree(t, orig)
	ctx := context.Background()
	base := filepath.Join(t.TempDir(), "base")
	lim := changeset.Limits{MaxEntries: 50, MaxFileBytes: 1000, MaxBaseBytes: 100}
	require.NoError(t, changeset.Snapshot(ctx, home, base, changeset.Options{Limits: lim}))

	outside := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(outside, []byte("host secret\n"), 0o600))
	symlink(t, home, "escape", outside)
	require.NoError(t, syscall.Mkfifo(filepath.Join(home, "fifo"), 0o644))
	write(t, home, "huge", strings.Repeat("y", 5000), 0o644)
	write(t, home, "big-before", strings.Repeat("w", 2000), 0o644)
	for i := range 60 {
		write(t, home, filepath.Join("many", strings.Repeat("d", i%3+1), "f"+string(rune('a'+i%26))+strings.Repeat("n", i/26)), "x\n", 0o644)
	}
	var patch bytes.Buffer
	set, err := changeset.Compute(ctx, base, home, &patch)
	require.NoError(t, err)
	ch := byPath(set)
	assert.Equal(t, "120000", ch["escape"].NewMode)
	assert.NotContains(t, patch.String(), "host secret", "a symlink is recorded, never followed")
	assert.Contains(t, patch.String(), "+"+outside)
	assert.NotContains(t, ch, "fifo")
	assert.Contains(t, ch["huge"].Omitted, "MaxFileBytes")
	assert.Contains(t, ch["big-before"].Omitted, "MaxBaseBytes")
	assert.NotContains(t, patch.String(), "yyyy")
	assert.Equal(t, 2, set.Summary.Omitted)
	assert.NotEmpty(t, set.Notes)
	reasons := ""
	for _, s := range set.Skipped {
		reasons += s.Path + ": " + s.Reason + "\n"
	}
	assert.Contains(t, reasons, "fifo")
	assert.Contains(t, reasons, "entry cap of 50")
}

func TestComputeWithoutSnapshotNamesTheFix(t *testing.T) {
	_, err := changeset.Compute(context.Background(), t.TempDir(), t.TempDir(), io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "call Snapshot")
}

func TestLargeRewriteFallsBackToAValidPatch(t *testing.T) {
	orig := t.TempDir()
	var a, b strings.Builder
	for i := range 3000 {
		a.WriteString("old " + strings.Repeat("o", i%7) + "\n")
		if i%2 == 0 {
			b.WriteString("new " + strings.Repeat("n", i%5) + "\n")
		} else {
			b.WriteString("old " + strings.Repeat("o", i%7) + "\n")
		}
	}
	write(t, orig, "big.txt", a.String(), 0o644)
	home := copyTree(t, orig)
	set, patch := run(t, home, changeset.Options{}, func() { write(t, home, "big.txt", b.String(), 0o644) })
	require.Len(t, set.Changes, 1)
	applies(t, orig, home, patch, nil)
}

func TestApplyAppliesOrRefusesWholly(t *testing.T) {
	orig := t.TempDir()
	plainTree(t, orig)
	home := copyTree(t, orig)
	_, patch := run(t, home, changeset.Options{}, func() { mutatePlain(t, home) })
	ctx := context.Background()

	fresh := copyTree(t, orig)
	require.NoError(t, changeset.Apply(ctx, fresh, bytes.NewReader(patch)))
	assert.Equal(t, treeOf(t, home, nil), treeOf(t, fresh, nil))

	// Applying twice fails and leaves the tree as it was.
	err := changeset.Apply(ctx, fresh, bytes.NewReader(patch))
	require.Error(t, err)
	assert.Equal(t, treeOf(t, home, nil), treeOf(t, fresh, nil))

	require.NoError(t, changeset.Apply(ctx, fresh, bytes.NewReader(nil)), "an empty change set applies as a no-op")
	require.Error(t, changeset.Apply(ctx, filepath.Join(fresh, "tool"), bytes.NewReader(patch)))
}

// Random edits (inserts, deletes, replacements, near and far apart, with and
// without a final newline, CRLF lines) all round-trip through git apply.
func TestRandomEditsRoundTrip(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { randomEdits(t, seed) })
	}
}

func randomEdits(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 2))
	orig := t.TempDir()
	texts := map[string][]string{}
	for f := range 40 {
		var ls []string
		for i := range rng.IntN(60) {
			ls = append(ls, fmt.Sprintf("line %d-%d%s", f, i, []string{"", "\r", " x"}[rng.IntN(3)]))
		}
		name := fmt.Sprintf("f%02d.txt", f)
		texts[name] = ls
		write(t, orig, name, joinLines(ls, f%3 == 0), 0o644)
	}
	home := copyTree(t, orig)
	_, patch := run(t, home, changeset.Options{}, func() {
		for name, ls := range texts {
			out := slices.Clone(ls)
			for range rng.IntN(8) {
				switch i := rng.IntN(len(out) + 1); rng.IntN(3) {
				case 0:
					out = slices.Insert(out, i, fmt.Sprintf("new %d", rng.IntN(1000)))
				case 1:
					if i < len(out) {
						out = slices.Delete(out, i, i+1)
					}
				default:
					if i < len(out) {
						out[i] = "changed"
					}
				}
			}
			write(t, home, name, joinLines(out, rng.IntN(2) == 0), 0o644)
		}
	})
	applies(t, orig, home, patch, nil)
}

func joinLines(ls []string, noFinalNewline bool) string {
	s := strings.Join(ls, "\n")
	if len(ls) > 0 && !noFinalNewline {
		s += "\n"
	}
	return s
}

// The agent's own state is no change to the user's code: the default
// excludes leave .taskrun-agent out of the patch and the list, and say so;
// Options.Exclude replaces the default, and an empty one excludes nothing.
func TestExcludesLeaveTheAgentsStateOut(t *testing.T) {
	orig := t.TempDir()
	write(t, orig, "main.go", "package main\n", 0o644)
	write(t, orig, ".taskrun-agent/old.json", "{}\n", 0o644)
	mutate := func(home string) func() {
		return func() {
			write(t, home, "main.go", "package main\n\nfunc main() {}\n", 0o644)
			write(t, home, ".taskrun-agent/conversation.json", "[]\n", 0o644)
			require.NoError(t, os.Remove(filepath.Join(home, ".taskrun-agent/old.json")))
			write(t, home, "sub/.taskrun-agent/x", "x\n", 0o644)
			write(t, home, "build/out.bin", "bin\n", 0o644)
		}
	}
	paths := func(set *changeset.Set) []string {
		var out []string
		for _, c := range set.Changes {
			out = append(out, c.Path)
		}
		return out
	}

	home := copyTree(t, orig)
	set, patch := run(t, home, changeset.Options{}, mutate(home))
	assert.Equal(t, []string{"build/out.bin", "main.go"}, paths(set))
	assert.Equal(t, changeset.DefaultExcludes, set.Excluded)
	assert.NotContains(t, string(patch), ".taskrun-agent")
	applies(t, orig, home, patch, func(rel string) bool { return filepath.Base(rel) == ".taskrun-agent" })

	home = copyTree(t, orig)
	set, patch = run(t, home, changeset.Options{Exclude: []string{"/build"}}, mutate(home))
	assert.Equal(t, []string{".taskrun-agent/conversation.json", ".taskrun-agent/old.json", "main.go", "sub/.taskrun-agent/x"}, paths(set))
	assert.Equal(t, []string{"/build"}, set.Excluded)
	assert.NotContains(t, string(patch), "build/out.bin")

	home = copyTree(t, orig)
	set, _ = run(t, home, changeset.Options{Exclude: []string{}}, mutate(home))
	assert.Len(t, set.Changes, 5)
	assert.Empty(t, set.Excluded)

	err := changeset.Snapshot(context.Background(), home, filepath.Join(t.TempDir(), "base"), changeset.Options{Exclude: []string{"/"}})
	assert.ErrorContains(t, err, "give a path relative to home")
}
