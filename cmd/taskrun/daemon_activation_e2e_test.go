package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/daemon"
)

// TestDaemonServesTheSocketSystemdPasses passes a listening unix socket to
// a real daemon process as systemd's socket activation does (descriptor 3,
// LISTEN_FDS=1, LISTEN_PID the daemon's own pid) and runs another uid's
// client through it. The daemon binds no socket of its own, and this test
// keeps no copy of the passed one once the daemon started: only the daemon
// can answer there.
func TestDaemonServesTheSocketSystemdPasses(t *testing.T) {
	e := newCrashEnv(t)
	dir := shareDir(t, "taskrun-sock-")
	sock := filepath.Join(dir, "activated.sock")
	own := filepath.Join(dir, "own.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	require.NoError(t, err)
	l.SetUnlinkOnClose(false)
	require.NoError(t, os.Chmod(sock, 0o666)) // systemd: SocketMode=0666
	f, err := l.File()
	require.NoError(t, err)
	require.NoError(t, l.Close())

	// sh sets LISTEN_PID to its own pid, which exec hands the daemon.
	args := []string{"-c", `LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=taskrun.socket exec "$0" "$@"`, taskrunBin(t),
		"daemon", "--root", e.root, "--store", e.store, "--image", testImage, "--helpers-dir", e.helpers}
	cmd := exec.Command("sh", args...)
	cmd.Env = append(os.Environ(), daemon.EnvSocket+"="+own)
	cmd.ExtraFiles = []*os.File{f}
	d := serveDaemon(t, cmd, sock)
	require.NoError(t, f.Close())

	require.Contains(t, d.log.String(), "socket="+sock, "the daemon says it serves the passed socket")
	require.NoFileExists(t, own, "the daemon bound a socket of its own")
	tenantName, err := daemon.UserNameTenant(nobody)
	require.NoError(t, err)
	stdout, stderr, code := d.runClient(t, nobody, "--image", testImage, "--", "sh", "-c", "echo activated")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "activated\n", stdout)
	assert.Contains(t, stderr, "tenants/"+tenantName+"/", "the run is the peer's tenant's: the daemon read its uid on the passed socket")
}
