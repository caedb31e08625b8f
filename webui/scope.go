package webui

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// tenantScoped is a Source narrowed to one tenant's runs: other tenants'
// runs are not listed and answer ErrNotFound, and hosts show only the
// tenant's leases.
type tenantScoped struct {
	src    Source
	tenant string
}

// source is what a request may read: the whole Source, or with
// Options.Tenant the one tenant's part of it.
func (h *Handler) source(r *http.Request) Source {
	if h.tenant == nil {
		return h.src
	}
	t, ok := h.tenant(r)
	if !ok {
		// No tenant known for the request: it may read nothing.
		return tenantScoped{src: h.src, tenant: ""}
	}
	return tenantScoped{src: h.src, tenant: t}
}

func (s tenantScoped) Runs(ctx context.Context, f Filter) ([]Run, error) {
	if s.tenant == "" || (f.Tenant != "" && f.Tenant != s.tenant) {
		return nil, nil
	}
	f.Tenant = s.tenant
	return s.src.Runs(ctx, f)
}

func (s tenantScoped) Run(ctx context.Context, id string) (Run, error) {
	run, err := s.src.Run(ctx, id)
	if err != nil {
		return Run{}, err
	}
	if s.tenant == "" || run.UserID != s.tenant {
		// The same answer as for a run that does not exist.
		return Run{}, fmt.Errorf("%w: no run %s", ErrNotFound, id)
	}
	return run, nil
}

func (s tenantScoped) FollowOutput(ctx context.Context, id string, offset int64, max int) (Chunk, error) {
	if _, err := s.Run(ctx, id); err != nil {
		return Chunk{}, err
	}
	return s.src.FollowOutput(ctx, id, offset, max)
}

func (s tenantScoped) OpenObject(ctx context.Context, id string, o Object) (io.ReadCloser, error) {
	if _, err := s.Run(ctx, id); err != nil {
		return nil, err
	}
	return s.src.OpenObject(ctx, id, o)
}

func (s tenantScoped) Artifacts(ctx context.Context, id string) ([]Artifact, error) {
	if _, err := s.Run(ctx, id); err != nil {
		return nil, err
	}
	return s.src.Artifacts(ctx, id)
}

func (s tenantScoped) OpenArtifact(ctx context.Context, id, path string) (io.ReadCloser, error) {
	if _, err := s.Run(ctx, id); err != nil {
		return nil, err
	}
	return s.src.OpenArtifact(ctx, id, path)
}

// Hosts keeps every host but only the tenant's leases.
func (s tenantScoped) Hosts(ctx context.Context) ([]Host, error) {
	hosts, err := s.src.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	for i := range hosts {
		var mine []Lease
		for _, l := range hosts[i].Leases {
			if s.tenant != "" && l.Tenant == s.tenant {
				mine = append(mine, l)
			}
		}
		hosts[i].Leases = mine
	}
	return hosts, nil
}
