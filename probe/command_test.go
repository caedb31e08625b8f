package probe

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckCommandFindsWhatKeepsACommandFromStarting(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), mode))
		require.NoError(t, os.Chmod(p, mode))
		return p
	}
	ok := write("ok.sh", "#!/bin/sh\nexit 0\n", 0o755)
	assert.Nil(t, CheckCommand([]string{ok}))

	missing := CheckCommand([]string{filepath.Join(dir, "absent")})
	require.NotNil(t, missing)
	assert.Empty(t, missing.Path)
	assert.Contains(t, missing.Need, "must exist in the image")

	notExec := CheckCommand([]string{write("plain", "#!/bin/sh\n", 0o644)})
	require.NotNil(t, notExec)
	assert.Contains(t, notExec.Problem, "is not executable by uid")
	assert.Contains(t, notExec.Problem, "mode 0644")
	assert.Contains(t, notExec.Need, "readable and executable by any uid")

	noInterp := CheckCommand([]string{write("script", "#!/no/such/python3 -u\n", 0o755)})
	require.NotNil(t, noInterp)
	assert.Contains(t, noInterp.Problem, "/no/such/python3 is missing from the image")

	t.Setenv("PATH", dir)
	assert.Nil(t, CheckCommand([]string{"ok.sh"}))
	notFound := CheckCommand([]string{"agent-cli"})
	require.NotNil(t, notFound)
	assert.Contains(t, notFound.Problem, `command "agent-cli" not found`)
}

// A dynamically linked binary whose loader the image lacks cannot start:
// the check names the loader (here a copy of a host binary whose loader
// path is changed to one that does not exist).
func TestCheckCommandFindsAMissingLoader(t *testing.T) {
	host, err := os.ReadFile("/bin/true")
	require.NoError(t, err)
	const loader = "/lib64/ld-linux-x86-64.so.2"
	if !bytes.Contains(host, []byte(loader)) {
		t.Skip("/bin/true is not dynamically linked against " + loader)
	}
	bin := filepath.Join(t.TempDir(), "agent")
	require.NoError(t, os.WriteFile(bin, bytes.Replace(host, []byte(loader), []byte("/lib64/ld-missing-x86-64.so"), 1), 0o755))
	assert.Nil(t, CheckCommand([]string{"/bin/true"}), "a loader that exists is no problem")
	p := CheckCommand([]string{bin})
	require.NotNil(t, p)
	assert.Contains(t, p.Problem, "dynamically linked and its loader /lib64/ld-missing-x86-64.so is missing")
	assert.Contains(t, p.Need, "static or self-contained binary")
}
