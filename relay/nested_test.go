package relay

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// asRelayEnv makes the test binary act as taskrun-relay (see TestMain), so
// a relay can run as a real process under another.
const asRelayEnv = "TASKRUN_RELAY_TEST_AS_RELAY"

func TestMain(m *testing.M) {
	if os.Getenv(asRelayEnv) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// freeLoopback returns a loopback address nothing listens on now.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// An agent's own `taskrun-relay -- AGENT` under the relay taskrun started
// just runs the agent, with the outer relay's base URLs; only the marker the
// outer relay sets makes it so: without it the inner relay fails to listen.
func TestRelayUnderRelayRunsTheCommand(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh on this machine")
	}
	self, err := os.Executable()
	require.NoError(t, err)
	t.Setenv(asRelayEnv, "1")
	for _, tc := range []struct {
		name  string
		unset bool
		code  int
	}{
		{name: "nested", code: 5},
		{name: "marker removed", unset: true, code: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := freeLoopback(t)
			out := filepath.Join(t.TempDir(), "env")
			script := `echo "$OPENAI_BASE_URL $TASKRUN_RELAY" > "$0"; exit 5`
			inner := []string{self, "-listen", addr, "--", "/bin/sh", "-c", script, out}
			if tc.unset {
				inner = append([]string{"/usr/bin/env", "-u", OuterEnv}, inner...)
			}
			code, err := run(context.Background(), options{
				listen:  addr,
				socket:  filepath.Join(t.TempDir(), "none.sock"),
				command: inner,
			}, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			assert.Equal(t, tc.code, code)
			got, err := os.ReadFile(out)
			if tc.unset {
				assert.ErrorIs(t, err, os.ErrNotExist, "the inner relay could not listen, so its command never ran")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "http://"+addr+"/v1 "+addr+"\n", string(got))
		})
	}
}
