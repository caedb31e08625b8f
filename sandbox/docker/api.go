package docker

// This file is the only one that imports the Docker client package. Moving to
// github.com/moby/moby/client means changing this file (and the API type
// imports), nothing else.

import (
	"context"
	"io"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	dockerimage "github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/system"
	"github.com/docker/docker/api/types/versions"
	"github.com/docker/docker/client"
)

// dockerAPI is the narrow part of the Docker Engine API the backend uses.
type dockerAPI interface {
	Ping(ctx context.Context) (types.Ping, error)
	DaemonHost() string
	ClientVersion() string
	Info(ctx context.Context) (system.Info, error)
	ImageInspect(ctx context.Context, ref string) (dockerimage.InspectResponse, error)
	ImagePull(ctx context.Context, ref string, options dockerimage.PullOptions) (io.ReadCloser, error)
	ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig,
		networkingConfig *network.NetworkingConfig, name string) (container.CreateResponse, error)
	ContainerAttach(ctx context.Context, id string, options container.AttachOptions) (types.HijackedResponse, error)
	ContainerWait(ctx context.Context, id string, condition container.WaitCondition) (<-chan container.WaitResponse, <-chan error)
	ContainerStart(ctx context.Context, id string, options container.StartOptions) error
	ContainerStop(ctx context.Context, id string, options container.StopOptions) error
	ContainerKill(ctx context.Context, id, signal string) error
	ContainerInspectWithRaw(ctx context.Context, id string, getSize bool) (container.InspectResponse, []byte, error)
	ContainerRemove(ctx context.Context, id string, options container.RemoveOptions) error
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	ContainerLogs(ctx context.Context, id string, options container.LogsOptions) (io.ReadCloser, error)
	ContainerStatsOneShot(ctx context.Context, id string) (container.StatsResponseReader, error)
	NetworkList(ctx context.Context, options network.ListOptions) ([]network.Summary, error)
	NetworkRemove(ctx context.Context, id string) error
	Close() error
}

// sdkClient adapts *client.Client to dockerAPI.
type sdkClient struct {
	*client.Client
}

// ContainerCreate creates a container for the host's platform.
func (c sdkClient) ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig,
	networkingConfig *network.NetworkingConfig, name string) (container.CreateResponse, error) {
	return c.Client.ContainerCreate(ctx, config, hostConfig, networkingConfig, nil, name)
}

// ImageInspect inspects a local image.
func (c sdkClient) ImageInspect(ctx context.Context, ref string) (dockerimage.InspectResponse, error) {
	return c.Client.ImageInspect(ctx, ref)
}

// newDockerAPI builds a client from DOCKER_HOST, DOCKER_API_VERSION,
// DOCKER_CERT_PATH and DOCKER_TLS_VERIFY, negotiating the API version with the
// daemon on first use.
func newDockerAPI() (dockerAPI, error) {
	c, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, err
	}
	return sdkClient{c}, nil
}

// negotiate pins the client's API version to the one the daemon reported.
func negotiate(api dockerAPI, ping types.Ping) {
	if c, ok := api.(sdkClient); ok {
		c.NegotiateAPIVersionPing(ping)
	}
}

// isNotFound reports whether err is the engine's "no such object" error.
func isNotFound(err error) bool { return cerrdefs.IsNotFound(err) }

// isUnauthorized reports whether err is the engine's "unauthorized" or
// "forbidden" error (a registry refused the credentials).
func isUnauthorized(err error) bool {
	return cerrdefs.IsUnauthorized(err) || cerrdefs.IsPermissionDenied(err)
}

// isInvalidArgument reports whether err is the engine's "invalid
// parameter" error (for a start: the command could not be executed).
func isInvalidArgument(err error) bool { return cerrdefs.IsInvalidArgument(err) }

// isConflict reports whether err is the engine's "conflict" error (e.g. a
// removal already in progress).
func isConflict(err error) bool { return cerrdefs.IsConflict(err) }

// isConnectionFailed reports whether err means the daemon could not be reached.
func isConnectionFailed(err error) bool { return client.IsErrConnectionFailed(err) }

// versionLess reports whether API version a is older than b.
func versionLess(a, b string) bool { return versions.LessThan(a, b) }
