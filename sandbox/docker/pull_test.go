package docker

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	dockerimage "github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/registrytest"
	"github.com/taskrun/taskrun/sandbox"
)

// pushTestImage pushes an image of its own into the test registry under a
// unique repository and removes it locally (and whatever a test pulls of
// it, at cleanup).
func pushTestImage(t *testing.T, reg *registrytest.Registry) (registrytest.Pushed, *client.Client) {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	repo := "taskrun-test/pull-" + uniqueValue(t)
	pushed, err := reg.BuildAndPush(t.Context(), cli, testImage, repo, "v1")
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, registrytest.RemoveImage(context.Background(), cli, pushed.ID))
		cli.Close()
	})
	return pushed, cli
}

// The engine pulls from a registry on 127.0.0.0/8 over plain HTTP without
// any daemon setting: the pull tests depend on it.
func TestLoopbackRegistriesAreInsecure(t *testing.T) {
	b, _ := newTestBackend(t)
	info, err := b.api.Info(t.Context())
	require.NoError(t, err)
	require.NotNil(t, info.RegistryConfig)
	var cidrs []string
	for _, c := range info.RegistryConfig.InsecureRegistryCIDRs {
		cidrs = append(cidrs, c.String())
	}
	require.Contains(t, cidrs, "127.0.0.0/8")
}

func TestResolveImagePullsWithDockerConfigCredentials(t *testing.T) {
	reg := testRegistry(t)
	pushed, cli := pushTestImage(t, reg)
	cfg, err := reg.WriteDockerConfig(filepath.Join(t.TempDir(), "docker"), registrytest.User, reg.Password)
	require.NoError(t, err)
	var log bytes.Buffer
	b, _ := newTestBackend(t, WithDockerConfig(cfg), WithLogger(slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))))

	// Not there locally, and never pulled under "never".
	_, err = b.ResolveImage(t.Context(), pushed.Ref, sandbox.PullNever)
	require.ErrorIs(t, err, sandbox.ErrImageNotFound)
	require.ErrorContains(t, err, "--pull missing")

	// By tag: pulled, with the registry's digest.
	img, err := b.ResolveImage(t.Context(), pushed.Ref, sandbox.PullMissing)
	require.NoError(t, err)
	assert.True(t, img.Pulled)
	assert.Equal(t, pushed.ID, img.ID)
	assert.Equal(t, pushed.Digest, img.RepoDigest)
	assert.Equal(t, pushed.Digest, img.Digest())
	// The log summarises the pull: bounded, no line per chunk.
	assert.Contains(t, log.String(), "pulled image")
	assert.Less(t, strings.Count(log.String(), "\n"), 40, log.String())

	// Present now: "missing" does not pull again, "always" does.
	img, err = b.ResolveImage(t.Context(), pushed.Ref, sandbox.PullMissing)
	require.NoError(t, err)
	assert.False(t, img.Pulled)
	img, err = b.ResolveImage(t.Context(), pushed.Ref, sandbox.PullAlways)
	require.NoError(t, err)
	assert.True(t, img.Pulled)

	// By digest, after the local copy is gone, on a terminal: shown as
	// docker pull shows it, each layer's line redrawn in place.
	require.NoError(t, registrytest.RemoveImage(t.Context(), cli, pushed.ID))
	var term bytes.Buffer
	tb, _ := newTestBackend(t, WithDockerConfig(cfg), WithPullProgress(&term, 0, true))
	img, err = tb.ResolveImage(t.Context(), pushed.Digest, sandbox.PullMissing)
	require.NoError(t, err)
	assert.Contains(t, term.String(), "Pulling from taskrun-test/")
	assert.Contains(t, term.String(), "Pull complete")
	assert.Contains(t, term.String(), "\x1b[", "progress lines are redrawn in place")
	assert.True(t, img.Pulled)
	assert.Equal(t, pushed.ID, img.ID)
	assert.Equal(t, pushed.Digest, img.RepoDigest)
}

func TestResolveImagePullFailuresSayWhy(t *testing.T) {
	reg := testRegistry(t)
	pushed, cli := pushTestImage(t, reg)
	dir := t.TempDir()

	t.Run("wrong password", func(t *testing.T) {
		cfg, err := reg.WriteDockerConfig(filepath.Join(dir, "wrong"), registrytest.User, "not-"+reg.Password)
		require.NoError(t, err)
		b, _ := newTestBackend(t, WithDockerConfig(cfg))
		_, err = b.ResolveImage(t.Context(), pushed.Ref, sandbox.PullMissing)
		require.ErrorIs(t, err, sandbox.ErrRegistryAuth)
		require.ErrorContains(t, err, "docker login "+reg.Addr)
	})
	t.Run("no credentials", func(t *testing.T) {
		b, _ := newTestBackend(t, WithDockerConfig(filepath.Join(dir, "none")))
		_, err := b.ResolveImage(t.Context(), pushed.Ref, sandbox.PullMissing)
		require.ErrorIs(t, err, sandbox.ErrRegistryAuth)
		require.ErrorContains(t, err, "docker login "+reg.Addr)
	})
	t.Run("unknown image", func(t *testing.T) {
		cfg, err := reg.WriteDockerConfig(filepath.Join(dir, "right"), registrytest.User, reg.Password)
		require.NoError(t, err)
		b, _ := newTestBackend(t, WithDockerConfig(cfg))
		_, err = b.ResolveImage(t.Context(), reg.Addr+"/taskrun-test/no-such-image-"+uniqueValue(t)+":v1", sandbox.PullMissing)
		require.ErrorIs(t, err, sandbox.ErrImageNotFound)
		require.ErrorContains(t, err, "check the repository and tag")
	})
	// Nothing of the image is left locally after the failed pulls.
	_, err := cli.ImageInspect(t.Context(), pushed.Ref)
	require.True(t, cerrdefs.IsNotFound(err), "the failed pulls left %s behind: %v", pushed.Ref, err)
}

// hungRegistryAPI is an engine whose pulls never progress: the registry
// behind it stopped answering.
type hungRegistryAPI struct{ dockerAPI }

func (hungRegistryAPI) ImageInspect(context.Context, string) (dockerimage.InspectResponse, error) {
	return dockerimage.InspectResponse{}, cerrdefs.ErrNotFound
}

func (hungRegistryAPI) ImagePull(ctx context.Context, _ string, _ dockerimage.PullOptions) (io.ReadCloser, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (hungRegistryAPI) DaemonHost() string { return "unix:///test" }

// A pull is bounded: a registry that stops answering fails the pull, it
// does not hold the run.
func TestPullIsBounded(t *testing.T) {
	b := &Backend{api: hungRegistryAPI{}, log: slog.New(slog.DiscardHandler), pullTimeout: time.Millisecond, dockerConfig: t.TempDir()}
	_, err := b.ResolveImage(t.Context(), "127.0.0.1:1/team/agent:v1", sandbox.PullMissing)
	require.ErrorIs(t, err, sandbox.ErrImagePull)
	require.ErrorContains(t, err, "no answer within 1ms")
}
