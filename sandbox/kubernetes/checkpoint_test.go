package kubernetes

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
)

func TestStartRefusesARestore(t *testing.T) {
	b := &Backend{}
	spec := sandbox.Spec{Image: "taskrun/testbox:local", Cmd: []string{"true"}, RestoreFrom: t.TempDir()}
	_, err := b.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.ErrorIs(t, err, sandbox.ErrCheckpointUnsupported)
	require.Equal(t, sandbox.CheckpointNone, b.Capabilities().CheckpointsFor(sandbox.RuntimeGVisor))
}
