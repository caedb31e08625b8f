package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/system"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
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
	return docker.HostFactsFromInfo(info), nil
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
		p, err := docker.PostureFromInspect(resp)
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

// ErrIncompleteInspect is returned for an inspect document that lacks the
// HostConfig or Config sections every rule depends on.
var ErrIncompleteInspect = docker.ErrIncompleteInspect

// ParseInspect decodes the raw JSON of `docker inspect` for one container
// (an object, or an array holding exactly one object, as the CLI prints it).
func ParseInspect(raw []byte) (Posture, error) {
	trimmed := strings.TrimSpace(string(raw))
	if strings.HasPrefix(trimmed, "[") {
		var many []json.RawMessage
		if err := json.Unmarshal(raw, &many); err != nil {
			return Posture{}, fmt.Errorf("parse inspect array: %w", err)
		}
		if len(many) != 1 {
			return Posture{}, fmt.Errorf("parse inspect: got %d containers; pass exactly one", len(many))
		}
		raw = many[0]
	}
	var resp container.InspectResponse
	if err := json.Unmarshal(raw, &resp); err != nil {
		return Posture{}, fmt.Errorf("parse inspect: %w", err)
	}
	return docker.PostureFromInspect(resp)
}

// FromInspect extracts the Posture from a decoded inspect response.
func FromInspect(resp container.InspectResponse) (Posture, error) {
	return docker.PostureFromInspect(resp)
}

// HostFactsFromInfo derives HostFacts from `docker info`.
func HostFactsFromInfo(info system.Info) HostFacts {
	return docker.HostFactsFromInfo(info)
}

// ParseHostInfo derives HostFacts from the JSON `docker info` document.
func ParseHostInfo(raw []byte) (HostFacts, error) {
	var info system.Info
	if err := json.Unmarshal(raw, &info); err != nil {
		return HostFacts{}, fmt.Errorf("parse engine info: %w", err)
	}
	return docker.HostFactsFromInfo(info), nil
}
