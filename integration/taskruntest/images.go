package taskruntest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/testcontainers/testcontainers-go"

	"github.com/taskrun/taskrun/images"
	"github.com/taskrun/taskrun/internal/runtest"
)

// DefaultRepo is the repository of images built without a Repo.
const DefaultRepo = "taskruntest/image"

// ImageSource is an image to build locally from a Dockerfile and host files.
// Nothing is pulled as long as the Dockerfile starts FROM scratch or from a
// local image.
type ImageSource struct {
	// Repo is the image's repository; DefaultRepo when empty. The tag is
	// generated, unique to the build.
	Repo string
	// Dockerfile is the Dockerfile's text.
	Dockerfile string
	// Files maps a name in the build context to the host file copied there
	// (mode 0755).
	Files map[string]string
}

// Image is a locally built image under a tag of its own.
type Image struct {
	// Ref is repo:tag.
	Ref string
}

// BuildImage builds src with testcontainers' FromDockerfile and returns the
// image; remove it with Image.Remove.
func BuildImage(ctx context.Context, src ImageSource) (*Image, error) {
	if src.Dockerfile == "" {
		return nil, fmt.Errorf("%w: ImageSource.Dockerfile is empty: give the Dockerfile's text", ErrBadOptions)
	}
	return BuildDefinition(ctx, src.Repo, images.Definition{DockerfileText: []byte(src.Dockerfile), Files: src.Files})
}

// BuildDefinition builds one of taskrun's own image definitions
// (images.Agent, images.Testbox) under repo with a unique tag, instead of its
// shared :local tag.
func BuildDefinition(ctx context.Context, repo string, def images.Definition) (*Image, error) {
	var buf bytes.Buffer
	if err := images.WriteContext(def, &buf); err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	return buildArchive(ctx, repo, buf.Bytes())
}

// buildArchive builds the tar build context archive as repo:<unique tag>.
func buildArchive(ctx context.Context, repo string, archive []byte) (*Image, error) {
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return nil, fmt.Errorf("testcontainers provider: %w", err)
	}
	defer provider.Close()
	var buildLog bytes.Buffer
	req := &testcontainers.ContainerRequest{FromDockerfile: testcontainers.FromDockerfile{
		ContextArchive: bytes.NewReader(archive),
		Repo:           defaultString(repo, DefaultRepo),
		Tag:            runtest.RandomID(),
		BuildLogWriter: &buildLog,
	}}
	ref, err := provider.BuildImage(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("build image %s:%s: %w; build log:\n%s", req.Repo, req.Tag, err, buildLog.String())
	}
	return &Image{Ref: ref}, nil
}

// Remove removes the image's tag, and the image with it unless another tag
// holds it. Cached base layers of other images stay.
func (i *Image) Remove(ctx context.Context) error {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return fmt.Errorf("docker client: %w", err)
	}
	defer cli.Close()
	if _, err := cli.ImageRemove(ctx, i.Ref, image.RemoveOptions{PruneChildren: true}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove image %s: %w", i.Ref, err)
	}
	return nil
}

// BuildStatic builds a Go command with CGO_ENABLED=0 into dir and returns the
// binary's path. pkg is a package of the current module (e.g.
// "github.com/taskrun/taskrun/cmd/taskrun-agent") or, with an @version,
// any module's command, installed through the module proxy or cache (e.g.
// "github.com/versity/versitygw/cmd/versitygw@v1.8.0"). The result is checked
// to be static.
func BuildStatic(ctx context.Context, dir, pkg string) (string, error) {
	name := path.Base(strings.SplitN(pkg, "@", 2)[0])
	var cmd *exec.Cmd
	if strings.Contains(pkg, "@") {
		cmd = exec.CommandContext(ctx, "go", "install", "-trimpath", "-ldflags=-s -w", pkg)
		cmd.Env = append(os.Environ(), "GOBIN="+dir)
	} else {
		cmd = exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, name), pkg)
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	bin := filepath.Join(dir, name)
	return bin, RequireStatic(bin)
}

// RequireStatic checks that bin is an ELF executable without a dynamic
// loader (images.RequireStatic).
func RequireStatic(bin string) error { return images.RequireStatic(bin) }
