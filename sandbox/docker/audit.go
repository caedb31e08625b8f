package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/system"

	"github.com/taskrun/taskrun/sandbox"
)

// What `taskrun audit` reads of live containers and of saved `docker
// inspect` and `docker info` documents; the rules are package audit's.

// ManagedIDs lists the IDs of all containers, running or not, that carry
// sandbox.LabelManaged=true and every extra label filter ("key=value").
func (b *Backend) ManagedIDs(ctx context.Context, extraLabels ...string) ([]string, error) {
	f := filters.NewArgs(filters.Arg("label", sandbox.LabelManaged+"=true"))
	for _, l := range extraLabels {
		f.Add("label", l)
	}
	list, err := b.api.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list containers labelled %s=true: %w", sandbox.LabelManaged, err)
	}
	ids := make([]string, len(list))
	for i, c := range list {
		ids[i] = c.ID
	}
	return ids, nil
}

// Postures reads the posture of the given containers, in order, or of
// every managed container (ManagedIDs) when ids is empty. It stops at the
// first error and names the container.
func (b *Backend) Postures(ctx context.Context, ids ...string) ([]sandbox.Posture, error) {
	if len(ids) == 0 {
		var err error
		if ids, err = b.ManagedIDs(ctx); err != nil {
			return nil, err
		}
	}
	out := make([]sandbox.Posture, 0, len(ids))
	for _, id := range ids {
		resp, _, err := b.api.ContainerInspectWithRaw(ctx, id, false)
		if err != nil {
			return nil, fmt.Errorf("inspect container %s: %w", id, err)
		}
		p, err := PostureFromInspect(resp)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", id, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// ParseInspect decodes the raw JSON of `docker inspect` for one container
// (an object, or an array holding exactly one object, as the CLI prints it)
// into its posture.
func ParseInspect(raw []byte) (sandbox.Posture, error) {
	trimmed := strings.TrimSpace(string(raw))
	if strings.HasPrefix(trimmed, "[") {
		var many []json.RawMessage
		if err := json.Unmarshal(raw, &many); err != nil {
			return sandbox.Posture{}, fmt.Errorf("parse inspect array: %w", err)
		}
		if len(many) != 1 {
			return sandbox.Posture{}, fmt.Errorf("parse inspect: got %d containers; pass exactly one", len(many))
		}
		raw = many[0]
	}
	var resp container.InspectResponse
	if err := json.Unmarshal(raw, &resp); err != nil {
		return sandbox.Posture{}, fmt.Errorf("parse inspect: %w", err)
	}
	return PostureFromInspect(resp)
}

// ParseHostInfo derives HostFacts from the JSON `docker info` document.
func ParseHostInfo(raw []byte) (sandbox.HostFacts, error) {
	var info system.Info
	if err := json.Unmarshal(raw, &info); err != nil {
		return sandbox.HostFacts{}, fmt.Errorf("parse engine info: %w", err)
	}
	return HostFactsFromInfo(info), nil
}
