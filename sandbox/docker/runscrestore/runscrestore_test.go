package runscrestore_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox/docker/runscrestore"
)

// bundle writes an OCI bundle whose process has env and returns its path.
func bundle(t *testing.T, env ...string) string {
	t.Helper()
	dir := t.TempDir()
	raw, err := json.Marshal(map[string]any{"process": map[string]any{"env": env}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o600))
	return dir
}

func TestParseSplitsGlobalFlagsAndCommand(t *testing.T) {
	c := runscrestore.Parse([]string{"--taskrun-runsc=/usr/bin/runsc", "--network=none", "--root", "/run/r", "--log", "/l.json", "--log-format", "json", "--systemd-cgroup", "create", "--bundle", "/b", "id1"})
	require.Equal(t, "/usr/bin/runsc", c.Runsc)
	require.Equal(t, []string{"--network=none", "--root", "/run/r", "--log", "/l.json", "--log-format", "json", "--systemd-cgroup"}, c.Global)
	require.Equal(t, "create", c.Command)
	require.Equal(t, []string{"--bundle", "/b", "id1"}, c.Args)
}

func TestRewriteRestoresWhenTheSpecAsks(t *testing.T) {
	img := t.TempDir()
	b := bundle(t, "PATH=/bin", runscrestore.EnvRestoreImage+"="+img)
	argv, err := runscrestore.Rewrite(runscrestore.Parse([]string{"--root", "/run/r", "create", "--bundle", b, "--pid-file", "/p", "--no-pivot", "id1"}))
	require.NoError(t, err)
	require.Equal(t, []string{"--root", "/run/r", "restore", "--detach", "--image-path", img, "--bundle", b, "--pid-file", "/p", "id1"}, argv)
}

func TestRewritePassesOtherCallsThrough(t *testing.T) {
	b := bundle(t, "PATH=/bin")
	_, err := runscrestore.Rewrite(runscrestore.Parse([]string{"--root", "/run/r", "create", "--bundle", b, "id1"}))
	require.ErrorIs(t, err, runscrestore.ErrNotRestoring)
	_, err = runscrestore.Rewrite(runscrestore.Parse([]string{"--root", "/run/r", "delete", "id1"}))
	require.ErrorIs(t, err, runscrestore.ErrNotRestoring)
}

func TestRewriteRefusesABadImagePath(t *testing.T) {
	for _, v := range []string{"relative/dir", filepath.Join(t.TempDir(), "missing")} {
		b := bundle(t, runscrestore.EnvRestoreImage+"="+v)
		_, err := runscrestore.Rewrite(runscrestore.Parse([]string{"create", "--bundle=" + b, "id1"}))
		require.Error(t, err)
		require.NotErrorIs(t, err, runscrestore.ErrNotRestoring)
	}
}
