package docker

import (
	"bytes"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
)

// pipedHandle is a handle whose attach stream is the client end of an
// in-memory pipe; the server end plays the engine.
func pipedHandle(t *testing.T, out *bytes.Buffer) (*handle, net.Conn) {
	t.Helper()
	b := &Backend{log: slog.Default(), drainIdle: 200 * time.Millisecond}
	client, server := net.Pipe()
	h := newHandle(b, "0123456789abcdef", sandbox.Spec{}, sandbox.Streams{Stdout: out})
	h.attach, h.attached = types.NewHijackedResponse(client, ""), true
	t.Cleanup(func() {
		_ = server.Close()
		h.release()
	})
	go h.pump()
	return h, server
}

// TestDrainGivesUpOnAStreamThatNeverCloses guards against attach streams that
// stay open after the container exited (moby #36516): Wait must not hang, and
// what arrived must be kept.
func TestDrainGivesUpOnAStreamThatNeverCloses(t *testing.T) {
	var out bytes.Buffer
	h, engine := pipedHandle(t, &out)
	_, err := stdcopy.NewStdWriter(engine, stdcopy.Stdout).Write([]byte("last words"))
	require.NoError(t, err)
	require.ErrorIs(t, h.drain(), ErrStreamStuck)
	require.Equal(t, "last words", out.String())
}

func TestDrainReadsToEOF(t *testing.T) {
	var out bytes.Buffer
	h, engine := pipedHandle(t, &out)
	go func() {
		w := stdcopy.NewStdWriter(engine, stdcopy.Stdout)
		_, _ = w.Write([]byte("one "))
		time.Sleep(50 * time.Millisecond)
		_, _ = w.Write([]byte("two, no newline"))
		_ = engine.Close()
	}()
	require.NoError(t, h.drain())
	require.Equal(t, "one two, no newline", out.String())
}

func TestNewNegotiatesAPIVersion(t *testing.T) {
	b, _ := newTestBackend(t)
	ping, err := b.api.Ping(t.Context())
	require.NoError(t, err)
	require.False(t, versionLess(ping.APIVersion, b.api.ClientVersion()),
		"client speaks API %s, newer than the engine's %s", b.api.ClientVersion(), ping.APIVersion)
}
