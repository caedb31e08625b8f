package unixsock

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestListenSharesSocketInReadOnlyDir(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "run", ".gateway", "x.sock")
	ln, err := Listen(sock, 10001)
	require.NoError(t, err)
	defer ln.Close()
	fi, err := os.Stat(sock)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, fi.Mode().Type())
	if os.Geteuid() == 0 {
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	} else {
		assert.Equal(t, os.FileMode(0o777), fi.Mode().Perm())
	}
	di, err := os.Stat(filepath.Dir(sock))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), di.Mode().Perm(), "others cannot replace the socket")

	// A stale socket from an earlier listener is replaced.
	ln.Close()
	require.NoError(t, os.WriteFile(sock, nil, 0o644))
	ln2, err := Listen(sock, 10001)
	require.NoError(t, err)
	ln2.Close()
}

func TestListenOnPathLongerThanBindTakes(t *testing.T) {
	deep := filepath.Join(t.TempDir(), "users", strings.Repeat("u", 60), "runs", strings.Repeat("r", 60))
	sock := filepath.Join(deep, ".gateway", "egress.sock")
	require.Greater(t, len(sock), MaxPath)
	ln, err := Listen(sock, 10001)
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("hi"))
			c.Close()
		}
	}()
	// Clients connect through a short path to the same directory.
	short := filepath.Join(t.TempDir(), "l")
	require.NoError(t, os.Symlink(filepath.Join(deep, ".gateway"), short))
	c, err := net.Dial("unix", filepath.Join(short, "egress.sock"))
	require.NoError(t, err)
	defer c.Close()
	buf := make([]byte, 2)
	_, err = c.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(buf))
}

func TestDialPathLongerThanConnectTakes(t *testing.T) {
	deep := filepath.Join(t.TempDir(), "users", strings.Repeat("u", 60), "runs", strings.Repeat("r", 60))
	sock := filepath.Join(deep, ".gateway", "model.sock")
	require.Greater(t, len(sock), MaxPath)
	ln, err := Listen(sock, os.Getuid())
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("hi"))
			c.Close()
		}
	}()
	_, err = net.Dial("unix", sock)
	require.Error(t, err, "connect(2) takes no path this long: Dial must go through the alias")
	c, err := Dial(sock)
	require.NoError(t, err)
	defer c.Close()
	buf := make([]byte, 2)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(buf))
}
