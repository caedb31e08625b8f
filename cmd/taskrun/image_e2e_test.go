package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/registrytest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
)

// The package's one registry, started by the first test that needs it.
var (
	registryOnce sync.Once
	testReg      *registrytest.Registry
	testRegErr   error
)

func testRegistry(t *testing.T) *registrytest.Registry {
	t.Helper()
	registryOnce.Do(func() { testReg, testRegErr = registrytest.Start(context.Background()) })
	if errors.Is(testRegErr, registrytest.ErrNoBinary) && !registrytest.Required() {
		t.Skip(testRegErr)
	}
	require.NoError(t, testRegErr)
	return testReg
}

func closeTestRegistry() {
	if testReg != nil {
		testReg.Close()
	}
}

// imageRun is `taskrun run --json` with a store and root of the test's own.
type imageRun struct {
	root, store string
}

func (r imageRun) run(t *testing.T, args ...string) (jsonResult, string, int) {
	t.Helper()
	base := []string{"run", "--root", r.root, "--store", r.store, "--helpers-dir", "", "--gc=false", "--user", tenant(t), "--json"}
	var stdout, stderr lockedbuf.Buffer
	code := dispatch(context.Background(), append(base, args...), &stdout, &stderr)
	var res jsonResult
	require.NoError(t, json.Unmarshal([]byte(stdout.String()), &res), "stdout: %s\nstderr: %s", stdout.String(), stderr.String())
	return res, stderr.String(), code
}

// assertNothingLeft checks that no container of the test's tenant exists,
// no run dir is left under root and the image is not on the host.
func assertNothingLeft(t *testing.T, docker *client.Client, root, image string) {
	t.Helper()
	list, err := docker.ContainerList(t.Context(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", "dev.taskrun.tenant="+tenant(t)))})
	require.NoError(t, err)
	assert.Empty(t, list, "containers left behind")
	entries, _ := os.ReadDir(filepath.Join(root, "users"))
	assert.Empty(t, entries, "run directories left behind")
	_, err = docker.ImageInspect(t.Context(), image)
	assert.True(t, cerrdefs.IsNotFound(err), "image %s is on the host: %v", image, err)
}

// A real run pulls its image from an authenticated registry by tag and by
// digest, with the credentials of the docker config, and records the
// image's repo digest; wrong credentials, an unknown image and an image
// outside --allowed-images fail before anything is created, naming the fix.
func TestRunPullsFromARegistry(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real containers")
	}
	reg := testRegistry(t)
	docker, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	defer docker.Close()
	pushed, err := reg.BuildAndPush(t.Context(), docker, testImage, "taskrun-test/run-"+tenant(t), "v1")
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, registrytest.RemoveImage(context.Background(), docker, pushed.ID)) })
	cfg, err := reg.WriteDockerConfig(filepath.Join(t.TempDir(), "docker"), registrytest.User, reg.Password)
	require.NoError(t, err)
	t.Setenv("DOCKER_CONFIG", cfg)
	r := imageRun{root: t.TempDir(), store: "file://" + t.TempDir()}

	t.Run("not allowed", func(t *testing.T) {
		res, stderr, code := r.run(t, "--image", pushed.Ref, "--allowed-images", pushed.Digest, "--", "true")
		assert.Equal(t, exitCannotRun, code, stderr)
		assert.Contains(t, res.Error, "--allowed-images")
		assertNothingLeft(t, docker, r.root, pushed.Ref)
	})
	t.Run("wrong credentials", func(t *testing.T) {
		bad, err := reg.WriteDockerConfig(filepath.Join(t.TempDir(), "docker"), registrytest.User, "wrong")
		require.NoError(t, err)
		t.Setenv("DOCKER_CONFIG", bad)
		res, stderr, code := r.run(t, "--image", pushed.Ref, "--", "true")
		assert.Equal(t, exitCannotRun, code, stderr)
		assert.Contains(t, res.Error, "registry refused the credentials")
		assert.Contains(t, res.Error, "docker login "+reg.Addr)
		assertNothingLeft(t, docker, r.root, pushed.Ref)
	})
	t.Run("unknown image", func(t *testing.T) {
		res, stderr, code := r.run(t, "--image", reg.Addr+"/taskrun-test/absent-"+tenant(t)+":v1", "--", "true")
		assert.Equal(t, exitCannotRun, code, stderr)
		assert.Contains(t, res.Error, "check the repository and tag")
		assertNothingLeft(t, docker, r.root, pushed.Ref)
	})
	t.Run("never", func(t *testing.T) {
		res, stderr, code := r.run(t, "--image", pushed.Ref, "--pull", "never", "--", "true")
		assert.Equal(t, exitCannotRun, code, stderr)
		assert.Contains(t, res.Error, "--pull missing")
		assertNothingLeft(t, docker, r.root, pushed.Ref)
	})
	t.Run("by tag", func(t *testing.T) {
		res, stderr, code := r.run(t, "--image", pushed.Ref, "--allowed-images", reg.Addr+"/taskrun-test/*:v1", "--", "cat", "/marker")
		require.Equal(t, 0, code, stderr)
		assert.Equal(t, model.StatusSucceeded, res.Status)
		assert.Equal(t, pushed.Ref, res.Image)
		assert.Equal(t, pushed.Digest, res.ImageDigest)
		assert.Contains(t, stderr, "pulled image")
		// The run record names the digest too.
		var out, errOut lockedbuf.Buffer
		require.Equal(t, 0, dispatch(context.Background(), []string{"inspect", "--store", r.store, "--json", res.RunID}, &out, &errOut), errOut.String())
		var rec struct {
			ImageDigest string `json:"image_digest"`
		}
		require.NoError(t, json.Unmarshal([]byte(out.String()), &rec))
		assert.Equal(t, pushed.Digest, rec.ImageDigest)
	})
	t.Run("by digest", func(t *testing.T) {
		require.NoError(t, registrytest.RemoveImage(t.Context(), docker, pushed.ID))
		res, stderr, code := r.run(t, "--image", pushed.Digest, "--allowed-images", pushed.Digest, "--", "cat", "/marker")
		require.Equal(t, 0, code, stderr)
		assert.Equal(t, pushed.Digest, res.ImageDigest)
	})
}

// An image whose USER is root (the test image sets none) runs as the run's
// own uid; one whose command the run's uid cannot execute, or that writes
// to the read-only root, fails with a reason that says what the image needs.
func TestAnyImageRunsUnderThePolicy(t *testing.T) {
	helpers := testbin.Dir(t)
	t.Run("root image runs as the run's uid", func(t *testing.T) {
		stdout, stderr, code := cli(t, "--image", testImage, "--helpers-dir", helpers, "--", "id", "-u")
		require.Equal(t, 0, code, stderr)
		uid, err := strconv.Atoi(strings.TrimSpace(stdout))
		require.NoError(t, err, stdout)
		assert.GreaterOrEqual(t, uid, 200000, "the run's uid comes from --uid-range")
	})
	t.Run("command not executable, with the self-check", func(t *testing.T) {
		_, stderr, code := cli(t, "--image", testImage, "--helpers-dir", helpers, "--", "/taskrun/AGENTS.md")
		assert.Equal(t, 126, code, stderr)
		assert.Contains(t, stderr, "/taskrun/AGENTS.md is not executable by uid")
		assert.Contains(t, stderr, "What an agent image needs")
	})
	t.Run("command missing, with the self-check", func(t *testing.T) {
		_, stderr, code := cli(t, "--image", testImage, "--helpers-dir", helpers, "--", "agent-cli")
		assert.Equal(t, 127, code, stderr)
		assert.Contains(t, stderr, `command "agent-cli" not found`)
	})
	t.Run("command not executable, without the self-check", func(t *testing.T) {
		_, stderr, code := cli(t, "--image", testImage, "--", "/taskrun/AGENTS.md")
		assert.Equal(t, 126, code, stderr)
		assert.Contains(t, stderr, "could not be found or executed")
		assert.Contains(t, stderr, "executable by any uid")
	})
	t.Run("write to the read-only root", func(t *testing.T) {
		_, stderr, code := cli(t, "--image", testImage, "--", "sh", "-c", "echo x > /etc/agent.conf")
		assert.NotEqual(t, 0, code, stderr)
		assert.Contains(t, stderr, "may write only under /taskrun/home")
	})
}
