package changeset

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// maxGitOutput bounds what is read from one git command.
const maxGitOutput = 64 << 20

// ErrGitUnavailable is wrapped when the workspace is a git repository but
// no git binary is on PATH.
var ErrGitUnavailable = errors.New("changeset: git not found on PATH: install git to diff git workspaces against their base commit")

// gitEnv is the environment of every git command: no system or global
// configuration, no prompts, no optional locks, a home with no files.
func gitEnv() []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=/nonexistent",
		"LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_ATTR_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_OPTIONAL_LOCKS=0",
		"GIT_NO_REPLACE_OBJECTS=1",
	}
}

// runGit runs git in dir with the hardened environment and command-line
// settings that switch off the repository configuration's ways of running
// programs (fsmonitor, hooks), feeding stdin and returning stdout. It is only
// ever run on the host's own copy of a workspace or on a scratch repository
// this package created, never inside a run's home.
func runGit(ctx context.Context, dir string, stdin io.Reader, args ...string) ([]byte, int, error) {
	bin, err := exec.LookPath("git")
	if err != nil {
		return nil, -1, ErrGitUnavailable
	}
	full := append([]string{
		"-c", "core.fsmonitor=false",
		"-c", "core.hooksPath=/dev/null",
		"-c", "safe.directory=" + dir,
		"-C", dir,
	}, args...)
	cmd := exec.CommandContext(ctx, bin, full...)
	cmd.Env = gitEnv()
	cmd.Stdin = stdin
	var out limitedBuffer
	out.limit = maxGitOutput
	var stderr limitedBuffer
	stderr.limit = 4 << 10
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err = cmd.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return out.Bytes(), exitErr.ExitCode(), fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		return nil, -1, fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	if out.over {
		return nil, 0, fmt.Errorf("git %s: output over %d bytes", strings.Join(args, " "), maxGitOutput)
	}
	return out.Bytes(), 0, nil
}

// limitedBuffer keeps the first limit bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	limit int
	over  bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.limit - b.Len(); len(p) > room {
		b.over = true
		b.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// isGitWorkTree reports whether dir has its own .git entry.
func isGitWorkTree(dir string) bool {
	_, err := os.Lstat(dir + "/.git")
	return err == nil
}

// baseCommit returns the commit HEAD names in the work tree dir, or "" for
// a repository without commits.
func baseCommit(ctx context.Context, dir string) (string, error) {
	out, code, err := runGit(ctx, dir, nil, "rev-parse", "--verify", "-q", "HEAD^{commit}")
	if code == 1 {
		return "", nil // unborn branch
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// trackedPaths lists the files of commit in dir.
func trackedPaths(ctx context.Context, dir, commit string) ([]string, error) {
	if commit == "" {
		return nil, nil
	}
	out, _, err := runGit(ctx, dir, nil, "ls-tree", "-r", "-z", "--name-only", "--full-tree", commit)
	if err != nil {
		return nil, err
	}
	return splitNUL(out), nil
}

func splitNUL(b []byte) []string {
	var out []string
	for _, p := range bytes.Split(b, []byte{0}) {
		if len(p) > 0 {
			out = append(out, string(p))
		}
	}
	return out
}

// initScratchRepo creates an empty repository in dir, without templates
// (so without sample hooks), used only to evaluate ignore rules.
func initScratchRepo(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	_, _, err := runGit(ctx, dir, nil, "init", "-q", "--template=", ".")
	return err
}

// ignoredPaths returns which of paths the ignore rules of the scratch
// repository in dir ignore.
func ignoredPaths(ctx context.Context, dir string, paths []string) (map[string]bool, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	var in bytes.Buffer
	for _, p := range paths {
		in.WriteString(p)
		in.WriteByte(0)
	}
	out, code, err := runGit(ctx, dir, &in, "check-ignore", "--no-index", "--stdin", "-z")
	if code == 1 {
		return nil, nil // nothing ignored
	}
	if err != nil {
		return nil, err
	}
	ignored := make(map[string]bool)
	for _, p := range splitNUL(out) {
		ignored[p] = true
	}
	return ignored, nil
}

// copyExcludeFile copies the work tree's .git/info/exclude (when .git is a
// directory) into the scratch repository at scratch.
func copyExcludeFile(workTree, scratch string) error {
	src, err := os.Open(workTree + "/.git/info/exclude")
	if err != nil {
		return nil //nolint:nilerr // a missing or unreadable exclude file only means fewer ignore rules
	}
	defer src.Close()
	if err := os.MkdirAll(scratch+"/.git/info", 0o700); err != nil {
		return err
	}
	dst, err := os.OpenFile(scratch+"/.git/info/exclude", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, io.LimitReader(src, maxIgnoreFileBytes)); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}
