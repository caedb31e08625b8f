package images

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWriteContextHasDockerfileAndInputs(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tool")
	require.NoError(t, os.WriteFile(bin, []byte("#!binary"), 0o755))
	def := Definition{Ref: "x:y", Dockerfile: "agent/Dockerfile", Files: map[string]string{"taskrun-agent": bin}}

	var buf bytes.Buffer
	require.NoError(t, WriteContext(def, &buf))

	got := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		got[h.Name] = string(data)
	}
	assert.Contains(t, got["Dockerfile"], "FROM scratch")
	assert.Equal(t, "#!binary", got["taskrun-agent"])
}

func TestAgentRefusesDynamicOrMissingBinary(t *testing.T) {
	_, err := Agent(t.TempDir())
	require.ErrorIs(t, err, ErrMissingInput)

	dir := t.TempDir()
	// /bin/ls on Debian is dynamically linked: it would not run on scratch.
	data, err := os.ReadFile("/bin/ls")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "taskrun-agent"), data, 0o755))
	_, err = Agent(dir)
	require.ErrorIs(t, err, ErrMissingInput)
}

func TestPodHelperRefusesDynamicOrMissingBinary(t *testing.T) {
	_, err := PodHelper(t.TempDir())
	require.ErrorIs(t, err, ErrMissingInput)
	dir := t.TempDir()
	data, err := os.ReadFile("/bin/ls")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "taskrun-pod"), data, 0o755))
	_, err = PodHelper(dir)
	require.ErrorIs(t, err, ErrMissingInput)
}

func TestEveryImageStartsFromScratch(t *testing.T) {
	for _, name := range []string{"agent/Dockerfile", "testbox/Dockerfile", "podhelper/Dockerfile"} {
		data, err := dockerfiles.ReadFile(name)
		require.NoError(t, err)
		assert.Regexp(t, `(?m)^FROM scratch$`, string(data), name)
	}
}

func TestBuildTestboxWithRealDocker(t *testing.T) {
	def, err := Testbox()
	if err != nil {
		t.Skipf("no static busybox on this host: %v", err)
	}
	cli, err := NewDockerClient()
	require.NoError(t, err)
	defer cli.Close()
	def.Ref = "taskrun/testbox:images-test"
	var out bytes.Buffer
	require.NoError(t, NewBuilder(cli, &out).Build(context.Background(), def))
	t.Cleanup(func() {
		_, _ = cli.ImageRemove(context.Background(), def.Ref, image.RemoveOptions{PruneChildren: true})
	})

	insp, err := cli.ImageInspect(context.Background(), def.Ref)
	require.NoError(t, err)
	assert.Equal(t, "testbox", insp.Config.Labels["dev.taskrun.image"])
}

// busyPruner is the engine while another prune runs: it refuses the
// builder's prune as the daemon does, with a conflict.
type busyPruner struct {
	*client.Client
	prunes int
}

func (b *busyPruner) ImagesPrune(context.Context, filters.Args) (image.PruneReport, error) {
	b.prunes++
	return image.PruneReport{}, fmt.Errorf("error response from daemon: a prune operation is already running: %w", cerrdefs.ErrConflict)
}

// Builds that run side by side (two `make images`) each prune what they
// replaced; the engine refuses the second prune, and the build still
// succeeds: its image is built and tagged.
func TestBuildSucceedsWhileAnotherPruneRuns(t *testing.T) {
	def, err := Testbox()
	if err != nil {
		t.Skipf("no static busybox on this host: %v", err)
	}
	cli, err := NewDockerClient()
	require.NoError(t, err)
	defer cli.Close()
	def.Ref = "taskrun/testbox:images-prune-test"
	api := &busyPruner{Client: cli}
	require.NoError(t, NewBuilder(api, io.Discard).Build(context.Background(), def))
	t.Cleanup(func() {
		_, _ = cli.ImageRemove(context.Background(), def.Ref, image.RemoveOptions{PruneChildren: true})
	})
	assert.Equal(t, 1, api.prunes)
	_, err = cli.ImageInspect(context.Background(), def.Ref)
	require.NoError(t, err)
}
