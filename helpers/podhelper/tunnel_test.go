package podhelper

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testdeadline"
)

// shortDir is a temp dir with a path short enough for unix sockets.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "tp")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// upcaseServer is the executor's socket (a stand-in gateway): it answers
// each line in upper case.
func upcaseServer(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					_, _ = io.WriteString(c, strings.ToUpper(line))
				}
			}()
		}
	}()
}

func TestTunnelCarriesAnAgentConnectionToTheExecutorsSocket(t *testing.T) {
	dir := shortDir(t)
	host := filepath.Join(dir, "host.sock")
	upcaseServer(t, host)
	control := filepath.Join(dir, "ctl.sock")
	agentSock := filepath.Join(dir, "data", ".gateway", "gw.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, control, []string{agentSock}) }()

	// The executor's session: the tunnel program in a process of its own,
	// its stdin and stdout the exec streams.
	cmd := helperCmd(t, "tunnel", control, agentSock)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, err := os.Stat(control); return err == nil }, testdeadline.Scale(10*time.Second), 10*time.Millisecond)
	require.NoError(t, cmd.Start())
	ready, paired := make(chan struct{}), make(chan struct{})
	carried := make(chan error, 1)
	go func() {
		carried <- Carry(stdout, stdin, func() { close(ready) }, func() { close(paired) },
			func() (net.Conn, error) { return net.Dial("unix", host) })
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the keeper never registered the tunnel")
	}

	agent, err := net.Dial("unix", agentSock)
	require.NoError(t, err)
	_, err = io.WriteString(agent, "hello model\n")
	require.NoError(t, err)
	line, err := bufio.NewReader(agent).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "HELLO MODEL\n", line)
	<-paired
	require.NoError(t, agent.Close())
	require.NoError(t, <-carried)
	require.NoError(t, cmd.Wait())
	cancel()
	require.NoError(t, <-served)
}

func TestTunnelForAnUnknownSocketIsRefused(t *testing.T) {
	dir := shortDir(t)
	control := filepath.Join(dir, "ctl.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = Serve(ctx, control, []string{filepath.Join(dir, "gw.sock")}) }()
	require.Eventually(t, func() bool { _, err := os.Stat(control); return err == nil }, testdeadline.Scale(10*time.Second), 10*time.Millisecond)
	c, err := net.Dial("unix", control)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "/etc/passwd\n")
	require.NoError(t, err)
	err = Carry(c, c, func() { t.Error("an unknown socket was registered") }, func() {}, nil)
	assert.True(t, errors.Is(err, ErrTunnelRefused), "got %v", err)
}
