package docker

import (
	"context"
	"log/slog"
	"testing"

	"github.com/docker/docker/api/types/system"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
)

// runtimesAPI is an engine at host that reports runtimes.
type runtimesAPI struct {
	dockerAPI
	host     string
	runtimes map[string]system.RuntimeWithStatus
}

func (a runtimesAPI) DaemonHost() string { return a.host }

func (a runtimesAPI) Info(context.Context) (system.Info, error) {
	return system.Info{Runtimes: a.runtimes}, nil
}

func TestMemoryCheckpointsNeedALocalEngineWithTheRestoreRuntime(t *testing.T) {
	both := map[string]system.RuntimeWithStatus{
		sandbox.RuntimeGVisor: {Runtime: system.Runtime{Path: "/bin/sh"}},
		RestoreRuntime:        {Runtime: system.Runtime{Path: "/bin/sh"}},
	}
	onlyRunsc := map[string]system.RuntimeWithStatus{sandbox.RuntimeGVisor: both[sandbox.RuntimeGVisor]}
	for _, tc := range []struct {
		name     string
		host     string
		runtimes map[string]system.RuntimeWithStatus
		want     sandbox.CheckpointKind
	}{
		{"local with both", "unix:///var/run/docker.sock", both, sandbox.CheckpointMemory},
		{"remote", "tcp://10.0.0.1:2376", both, sandbox.CheckpointNone},
		{"no restore runtime", "unix:///var/run/docker.sock", onlyRunsc, sandbox.CheckpointNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &Backend{api: runtimesAPI{host: tc.host, runtimes: tc.runtimes}, log: slog.Default(), live: map[string]*handle{}}
			require.Equal(t, tc.want, b.Capabilities().CheckpointsFor(sandbox.RuntimeGVisor))
		})
	}
}
