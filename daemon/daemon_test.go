package daemon

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSocketPath(t *testing.T) {
	t.Setenv(EnvSocket, "/tmp/x.sock")
	assert.Equal(t, "/tmp/x.sock", SocketPath())
	t.Setenv(EnvSocket, "")
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	if os.Geteuid() == 0 {
		assert.Equal(t, RootSocket, SocketPath())
	} else {
		assert.Equal(t, "/run/user/1000/taskrun.sock", SocketPath())
	}
}

func TestClientSocketPaths(t *testing.T) {
	t.Setenv(EnvSocket, "/tmp/x.sock")
	assert.Equal(t, []string{"/tmp/x.sock"}, ClientSocketPaths())
	t.Setenv(EnvSocket, "")
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	if os.Geteuid() == 0 {
		assert.Equal(t, []string{RootSocket}, ClientSocketPaths())
	} else {
		assert.Equal(t, []string{"/run/user/1000/taskrun.sock", RootSocket}, ClientSocketPaths())
	}
}

func TestDialFirstTakesTheFirstThatAnswers(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	l, err := Listen(live)
	require.NoError(t, err)
	defer l.Close()
	c, err := DialFirst(context.Background(), []string{filepath.Join(dir, "none.sock"), live})
	require.NoError(t, err)
	assert.Equal(t, live, c.Path())
	c.Close()
	_, err = DialFirst(context.Background(), []string{filepath.Join(dir, "none.sock")})
	require.ErrorIs(t, err, ErrNoDaemon)
}

func TestListenMakesTheSocketAndRefusesALiveOne(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "taskrun")
	path := filepath.Join(dir, "taskrun.sock")
	l, err := Listen(path)
	require.NoError(t, err)
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket|0o666, info.Mode()&(os.ModeSocket|os.ModePerm))
	dinfo, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), dinfo.Mode().Perm())

	_, err = Listen(path)
	require.Error(t, err, "a second daemon on a live socket")
	assert.Contains(t, err.Error(), "already answers")

	// A stale socket (its daemon killed) is replaced.
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	require.FileExists(t, path)
	_, err = Dial(context.Background(), path)
	require.ErrorIs(t, err, ErrNoDaemon)
	l2, err := Listen(path)
	require.NoError(t, err)
	require.NoError(t, l2.Close())
}

func TestDialWithoutADaemon(t *testing.T) {
	_, err := Dial(context.Background(), filepath.Join(t.TempDir(), "none.sock"))
	require.ErrorIs(t, err, ErrNoDaemon)
	_, err = Dial(context.Background(), "")
	require.ErrorIs(t, err, ErrNoDaemon)
}

func TestPeerIsTheConnectingProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.sock")
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	defer l.Close()
	go func() {
		c, err := net.Dial("unix", path)
		if err == nil {
			defer c.Close()
			var b [1]byte
			_, _ = c.Read(b[:])
		}
	}()
	c, err := l.Accept()
	require.NoError(t, err)
	defer c.Close()
	p, err := peerOf(c)
	require.NoError(t, err)
	assert.Equal(t, uint32(os.Getuid()), p.UID)
	assert.Equal(t, uint32(os.Getgid()), p.GID)
	assert.Equal(t, int32(os.Getpid()), p.PID)

	_, err = peerFrom(context.Background())
	require.Error(t, err, "a request with no peer is refused")
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer tcp.Close()
	go func() {
		if c, err := net.Dial("tcp", tcp.Addr().String()); err == nil {
			defer c.Close()
			var b [1]byte
			_, _ = c.Read(b[:])
		}
	}()
	tc, err := tcp.Accept()
	require.NoError(t, err)
	defer tc.Close()
	_, err = peerOf(tc)
	require.Error(t, err, "a TCP connection has no peer credentials")
}

func TestUserNameTenant(t *testing.T) {
	name, err := UserNameTenant(0)
	require.NoError(t, err)
	assert.Equal(t, "root", name)
	name, err = UserNameTenant(4294967)
	require.NoError(t, err)
	assert.Equal(t, "uid-4294967", name)
}
