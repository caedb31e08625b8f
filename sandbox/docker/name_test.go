package docker

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
)

// A container gets the Spec's name; when a container of a reused run ID
// still holds it, the new one gets the name with a random suffix instead of
// failing.
func TestContainerNameAndTakenName(t *testing.T) {
	b, labels := newTestBackend(t)
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o777))
	name := "taskrun-name-test-" + labels[labelTest]
	spec := sandbox.Spec{
		Name:  name,
		Image: testImage, Cmd: []string{"sleep", "1000"}, Labels: labels,
		Run:     model.RunRef{UserID: "tenant-n", ConversationID: "conv-n", TaskID: "task-n", RunID: "run-n"},
		Mounts:  []sandbox.Mount{{Source: dir, Target: "/taskrun"}},
		Timeout: time.Minute, StopGrace: time.Second,
	}
	nameOf := func(h sandbox.Handle) string {
		info, _, err := b.api.ContainerInspectWithRaw(t.Context(), h.ID(), false)
		require.NoError(t, err)
		return info.Name
	}
	first, err := b.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, first.Close(t.Context())) })
	assert.Equal(t, "/"+name, nameOf(first))

	second, err := b.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, second.Close(t.Context())) })
	assert.Regexp(t, "^/"+name+"-[a-z0-9]{8}$", nameOf(second))
}
