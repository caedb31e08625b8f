package helpers

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/sandbox"
)

func TestMainDispatchesByProgramName(t *testing.T) {
	code, ok := Main([]string{"/.taskrun/bin/taskrun-relay", "-listen", "0.0.0.0:8411"})
	assert.True(t, ok)
	assert.Equal(t, 2, code, "the relay refused a non-loopback listen address")

	code, ok = Main([]string{"taskrun-probe"})
	assert.True(t, ok)
	assert.Equal(t, 2, code, "the self-check wants --nonce")

	for _, argv := range [][]string{{"/usr/local/bin/taskrun", "run"}, {"taskrun-probe-x"}, {}} {
		_, ok = Main(argv)
		assert.False(t, ok, "%q names no helper", argv)
	}
}

// dynamicELF is a dynamically linked program of the host.
func dynamicELF(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/bin/ls", "/usr/bin/ls", "/bin/true", "/usr/bin/true"} {
		if CheckStatic(p) != nil {
			return p
		}
	}
	t.Skip("no dynamically linked program on this host")
	return ""
}

func TestCheckStatic(t *testing.T) {
	assert.NoError(t, CheckStatic(testbin.Program(t, "./internal/testbin/kernelcalls")))
	err := CheckStatic(dynamicELF(t))
	require.ErrorIs(t, err, ErrNotStatic)
	assert.Contains(t, err.Error(), "ld-")

	script := filepath.Join(t.TempDir(), "script")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755))
	assert.Error(t, CheckStatic(script), "not an ELF file")
}

func TestFromExecutableCopiesOnceIntoTheCache(t *testing.T) {
	exe := testbin.Program(t, "./internal/testbin/kernelcalls")
	cache := t.TempDir()
	files, err := fromExecutable(exe, cache)
	require.NoError(t, err)
	require.Len(t, files, 2)
	src := files[ProbeName]
	assert.Equal(t, src, files[RelayName], "one multi-call binary serves every helper")
	rel, err := filepath.Rel(cache, src)
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9a-f]{64}/taskrun$`, rel)
	want, err := os.ReadFile(exe)
	require.NoError(t, err)
	got, err := os.ReadFile(src)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	info, err := os.Stat(src)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o555), info.Mode().Perm())

	again, err := fromExecutable(exe, cache)
	require.NoError(t, err)
	assert.Equal(t, files, again)
	entries, err := os.ReadDir(filepath.Dir(src))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temp file left behind")

	assert.Equal(t, []sandbox.Mount{
		{Source: src, Target: "/.taskrun/bin/taskrun-probe", ReadOnly: true},
		{Source: src, Target: "/.taskrun/bin/taskrun-relay", ReadOnly: true},
	}, files.Mounts())
	assert.Equal(t, map[string]string{ProbePath: src, RelayPath: src}, files.Sources())
}

func TestFromExecutableRefusesADynamicBinary(t *testing.T) {
	_, err := fromExecutable(dynamicELF(t), t.TempDir())
	require.ErrorIs(t, err, ErrNotStatic)
	assert.Contains(t, err.Error(), "CGO_ENABLED=0")
}

func TestFromDir(t *testing.T) {
	static := testbin.Program(t, "./internal/testbin/kernelcalls")
	data, err := os.ReadFile(static)
	require.NoError(t, err)

	dir := t.TempDir()
	_, err = FromDir(dir)
	assert.ErrorContains(t, err, "taskrun-probe", "the self-check is required")

	require.NoError(t, os.WriteFile(filepath.Join(dir, ProbeName), data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "other-program"), data, 0o755))
	files, err := FromDir(dir)
	require.NoError(t, err)
	assert.Equal(t, Files{ProbeName: filepath.Join(dir, ProbeName)}, files, "only helper files, the relay is optional")

	dyn, err := os.ReadFile(dynamicELF(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, RelayName), dyn, 0o755))
	_, err = FromDir(dir)
	assert.ErrorIs(t, err, ErrNotStatic)
}

func TestFromExecutableReplacesATamperedCopy(t *testing.T) {
	exe := testbin.Program(t, "./internal/testbin/kernelcalls")
	cache := t.TempDir()
	files, err := fromExecutable(exe, cache)
	require.NoError(t, err)
	src := files[ProbeName]
	info, err := os.Stat(src)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(src, 0o755))
	require.NoError(t, os.WriteFile(src, make([]byte, info.Size()), 0o755))

	again, err := fromExecutable(exe, cache)
	require.NoError(t, err)
	want, err := os.ReadFile(exe)
	require.NoError(t, err)
	got, err := os.ReadFile(again[ProbeName])
	require.NoError(t, err)
	assert.Equal(t, want, got, "a copy of the same size but other content is replaced")
}

// The stamp that spares later runs the hash is trusted only while the copy
// is untouched: a rewrite that restores its size and modification time
// still changes its change time, and the copy is made again.
func TestFromExecutableStampDoesNotHideATamperedCopy(t *testing.T) {
	exe := testbin.Program(t, "./internal/testbin/kernelcalls")
	cache := t.TempDir()
	files, err := fromExecutable(exe, cache)
	require.NoError(t, err)
	src := files[ProbeName]
	again, err := fromExecutable(exe, cache)
	require.NoError(t, err)
	require.Equal(t, files, again, "the stamped copy is used")

	info, err := os.Stat(src)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(src, 0o755))
	require.NoError(t, os.WriteFile(src, make([]byte, info.Size()), 0o755))
	require.NoError(t, os.Chmod(src, 0o555))
	require.NoError(t, os.Chtimes(src, info.ModTime(), info.ModTime()))

	third, err := fromExecutable(exe, cache)
	require.NoError(t, err)
	want, err := os.ReadFile(exe)
	require.NoError(t, err)
	got, err := os.ReadFile(third[ProbeName])
	require.NoError(t, err)
	assert.Equal(t, want, got, "the tampered copy is replaced despite its stamp")
}
