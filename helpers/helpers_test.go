package helpers

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
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
	files, err := fromExecutable(exe, "", cache)
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

	again, err := fromExecutable(exe, "", cache)
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
	_, err := fromExecutable(dynamicELF(t), "", t.TempDir())
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
	files, err := fromExecutable(exe, "", cache)
	require.NoError(t, err)
	src := files[ProbeName]
	info, err := os.Stat(src)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(src, 0o755))
	require.NoError(t, os.WriteFile(src, make([]byte, info.Size()), 0o755))

	again, err := fromExecutable(exe, "", cache)
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
	files, err := fromExecutable(exe, "", cache)
	require.NoError(t, err)
	src := files[ProbeName]
	again, err := fromExecutable(exe, "", cache)
	require.NoError(t, err)
	require.Equal(t, files, again, "the stamped copy is used")

	info, err := os.Stat(src)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(src, 0o755))
	require.NoError(t, os.WriteFile(src, make([]byte, info.Size()), 0o755))
	require.NoError(t, os.Chmod(src, 0o555))
	require.NoError(t, os.Chtimes(src, info.ModTime(), info.ModTime()))

	third, err := fromExecutable(exe, "", cache)
	require.NoError(t, err)
	want, err := os.ReadFile(exe)
	require.NoError(t, err)
	got, err := os.ReadFile(third[ProbeName])
	require.NoError(t, err)
	assert.Equal(t, want, got, "the tampered copy is replaced despite its stamp")
}

// installed lays out dir as `make build` does: the executable as taskrun and
// the given helpers beside it. It returns the executable's path.
func installed(t *testing.T, exe string, beside map[string]string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	copyFile := func(src, dst string) {
		data, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(dst, data, 0o755))
	}
	copyFile(exe, filepath.Join(dir, "taskrun"))
	for name, src := range beside {
		copyFile(src, filepath.Join(dir, name))
	}
	return filepath.Join(dir, "taskrun"), dir
}

func TestFromExecutablePrefersTheHelpersBesideItOfTheSameBuild(t *testing.T) {
	if CheckStatic("/bin/busybox") != nil {
		t.Skip("no static busybox (make setup installs busybox-static)")
	}
	exe, dir := installed(t, testbin.Program(t, "./internal/testbin/kernelcalls"), map[string]string{
		ProbeName: testbin.Program(t, "./cmd/taskrun-probe"),
		// Static, but no Go program of this build: the binary itself is used.
		RelayName: "/bin/busybox",
	})
	cache := t.TempDir()
	files, err := fromExecutable(exe, dir, cache)
	require.NoError(t, err)

	probe, err := os.ReadFile(filepath.Join(dir, ProbeName))
	require.NoError(t, err)
	got, err := os.ReadFile(files[ProbeName])
	require.NoError(t, err)
	assert.Equal(t, probe, got, "the self-check is the separately built one")
	rel, err := filepath.Rel(cache, files[ProbeName])
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9a-f]{64}/taskrun-probe$`, rel, "a private copy, not the installed file")

	self, err := os.ReadFile(exe)
	require.NoError(t, err)
	got, err = os.ReadFile(files[RelayName])
	require.NoError(t, err)
	assert.Equal(t, self, got, "a helper of no known build is the binary itself")

	again, err := fromExecutable(exe, dir, cache)
	require.NoError(t, err)
	assert.Equal(t, files, again)
}

func TestFromExecutableIgnoresHelpersOfAnotherBuild(t *testing.T) {
	other := filepath.Join(t.TempDir(), ProbeName)
	cmd := exec.Command("go", "build", "-tags", "taskrun_other_build", "-o", other, "./cmd/taskrun-probe")
	cmd.Dir = filepath.Join("..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	exe, dir := installed(t, testbin.Program(t, "./internal/testbin/kernelcalls"), map[string]string{ProbeName: other})
	files, err := fromExecutable(exe, dir, t.TempDir())
	require.NoError(t, err)
	self, err := os.ReadFile(exe)
	require.NoError(t, err)
	for _, name := range Names {
		got, err := os.ReadFile(files[name])
		require.NoError(t, err)
		assert.Equal(t, self, got, "%s: built with other tags, so not installed with this binary", name)
	}
}

func TestFromExecutableIgnoresADynamicHelperBesideIt(t *testing.T) {
	exe, dir := installed(t, testbin.Program(t, "./internal/testbin/kernelcalls"), map[string]string{ProbeName: dynamicELF(t)})
	files, err := fromExecutable(exe, dir, t.TempDir())
	require.NoError(t, err)
	self, err := os.ReadFile(exe)
	require.NoError(t, err)
	got, err := os.ReadFile(files[ProbeName])
	require.NoError(t, err)
	assert.Equal(t, self, got)
}

func TestSameBuild(t *testing.T) {
	base := func() *debug.BuildInfo {
		return &debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Path: "github.com/taskrun/taskrun", Version: "v1.2.3", Sum: "h1:a"},
			Deps:      []*debug.Module{{Path: "example.com/dep", Version: "v1.0.0", Sum: "h1:d"}},
			Settings:  []debug.BuildSetting{{Key: "CGO_ENABLED", Value: "0"}, {Key: "vcs.revision", Value: "abc"}},
		}
	}
	assert.True(t, SameBuild(base(), base()))
	for name, change := range map[string]func(*debug.BuildInfo){
		"toolchain":      func(b *debug.BuildInfo) { b.GoVersion = "go1.26.9" },
		"module version": func(b *debug.BuildInfo) { b.Main.Version = "v1.2.4" },
		"module sum":     func(b *debug.BuildInfo) { b.Main.Sum = "h1:b" },
		"revision":       func(b *debug.BuildInfo) { b.Settings[1].Value = "abd" },
		"cgo":            func(b *debug.BuildInfo) { b.Settings[0].Value = "1" },
		"tags": func(b *debug.BuildInfo) {
			b.Settings = append(b.Settings, debug.BuildSetting{Key: "-tags", Value: "x"})
		},
		"dependency": func(b *debug.BuildInfo) { b.Deps[0].Version = "v1.0.1" },
	} {
		other := base()
		change(other)
		assert.False(t, SameBuild(base(), other), name)
		assert.False(t, SameBuild(other, base()), name)
	}
	fewer := base()
	fewer.Deps = nil
	assert.True(t, SameBuild(base(), fewer), "a helper links fewer dependencies than the executor")
}
