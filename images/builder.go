package images

import (
	"context"
	"fmt"
	"io"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/jsonmessage"
	"github.com/moby/term"
)

// BuildAPI is the part of the Docker client the builder uses.
type BuildAPI interface {
	ImageBuild(ctx context.Context, buildContext io.Reader, options build.ImageBuildOptions) (build.ImageBuildResponse, error)
	ImagesPrune(ctx context.Context, pruneFilter filters.Args) (image.PruneReport, error)
}

// LabelBuiltBy marks every image the builder makes.
const LabelBuiltBy = "dev.taskrun.built-by"

// Builder builds image definitions through a Docker engine.
type Builder struct {
	api BuildAPI
	out io.Writer
}

// NewBuilder returns a Builder that reports progress to out: a live display
// when out is a terminal, plain lines otherwise.
func NewBuilder(api BuildAPI, out io.Writer) *Builder {
	return &Builder{api: api, out: out}
}

// NewDockerClient connects to the engine named by DOCKER_HOST (or the default
// socket) with API version negotiation.
func NewDockerClient() (*client.Client, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	return cli, nil
}

// Build builds def and tags it def.Ref. The build never pulls: every base is
// scratch.
func (b *Builder) Build(ctx context.Context, def Definition) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(WriteContext(def, pw)) }()
	defer pr.Close()

	resp, err := b.api.ImageBuild(ctx, pr, build.ImageBuildOptions{
		Tags:        []string{def.Ref},
		Remove:      true,
		ForceRemove: true,
		PullParent:  false,
		NetworkMode: "none",
		Labels:      map[string]string{LabelBuiltBy: "taskrun"},
	})
	if client.IsErrConnectionFailed(err) {
		return fmt.Errorf("build %s: cannot reach the Docker daemon; start dockerd or set DOCKER_HOST: %w", def.Ref, err)
	}
	if err != nil {
		return fmt.Errorf("build %s: %w", def.Ref, err)
	}
	defer resp.Body.Close()

	fd, isTerm := term.GetFdInfo(b.out)
	if err := jsonmessage.DisplayJSONMessagesStream(resp.Body, b.out, fd, isTerm, nil); err != nil {
		return fmt.Errorf("build %s: %w", def.Ref, err)
	}
	// A rebuild leaves the previous image untagged; drop those of ours. The
	// engine runs one prune at a time and refuses another (a conflict): the
	// one running, or the next build's, removes these too.
	if _, err := b.api.ImagesPrune(ctx, filters.NewArgs(
		filters.Arg("dangling", "true"), filters.Arg("label", LabelBuiltBy+"=taskrun"))); err != nil && !cerrdefs.IsConflict(err) {
		return fmt.Errorf("prune replaced images: %w", err)
	}
	return nil
}
