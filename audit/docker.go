package audit

import (
	"context"
	"errors"
	"fmt"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/system"

	"github.com/taskrun/taskrun/sandbox"
)

// DockerAPI is the part of the Docker client the audit uses;
// *client.Client implements it.
type DockerAPI interface {
	ContainerInspect(ctx context.Context, containerID string) (container.InspectResponse, error)
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	Info(ctx context.Context) (system.Info, error)
}

// Host reads the daemon's HostFacts.
func Host(ctx context.Context, cli DockerAPI) (HostFacts, error) {
	info, err := cli.Info(ctx)
	if err != nil {
		return HostFacts{}, fmt.Errorf("docker info: %w", err)
	}
	return HostFactsFromInfo(info), nil
}

// Inspect reads the Posture of each container, in order. It stops at the
// first error and names the container.
func Inspect(ctx context.Context, cli DockerAPI, ids ...string) ([]Posture, error) {
	out := make([]Posture, 0, len(ids))
	for _, id := range ids {
		resp, err := cli.ContainerInspect(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("inspect container %s: %w", id, err)
		}
		p, err := FromInspect(resp)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", id, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// ManagedIDs lists the IDs of all containers, running or not, that carry
// sandbox.LabelManaged=true, plus any extra label filters ("key=value").
func ManagedIDs(ctx context.Context, cli DockerAPI, extraLabels ...string) ([]string, error) {
	f := filters.NewArgs(filters.Arg("label", sandbox.LabelManaged+"=true"))
	for _, l := range extraLabels {
		f.Add("label", l)
	}
	list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list containers labelled %s=true: %w", sandbox.LabelManaged, err)
	}
	ids := make([]string, len(list))
	for i, c := range list {
		ids[i] = c.ID
	}
	return ids, nil
}

// ErrNoContainers is returned by Containers when nothing matched.
var ErrNoContainers = errors.New("no containers to audit")

// Containers audits the given containers against the daemon's host facts.
func Containers(ctx context.Context, cli DockerAPI, opts Options, ids ...string) ([]Report, error) {
	if len(ids) == 0 {
		return nil, ErrNoContainers
	}
	host, err := Host(ctx, cli)
	if err != nil {
		return nil, err
	}
	postures, err := Inspect(ctx, cli, ids...)
	if err != nil {
		return nil, err
	}
	reports := make([]Report, len(postures))
	for i, p := range postures {
		reports[i] = Check(p, host, opts)
	}
	return reports, nil
}
