package sandbox

import (
	"context"
	"fmt"
)

// PullPolicy says when a backend pulls a run's image from its registry, as
// docker run --pull does.
type PullPolicy string

// The pull policies.
const (
	// PullMissing pulls the image only when it does not exist locally (the
	// default).
	PullMissing PullPolicy = "missing"
	// PullAlways pulls the image before every run, so a moved tag is
	// followed; an image that exists only locally cannot be used.
	PullAlways PullPolicy = "always"
	// PullNever uses only local images; a missing one fails the run.
	PullNever PullPolicy = "never"
)

// DefaultPullPolicy is the policy of a run that sets none.
const DefaultPullPolicy = PullMissing

// ParsePullPolicy parses a --pull value; "" is DefaultPullPolicy.
func ParsePullPolicy(s string) (PullPolicy, error) {
	switch p := PullPolicy(s); p {
	case "":
		return DefaultPullPolicy, nil
	case PullMissing, PullAlways, PullNever:
		return p, nil
	}
	return "", fmt.Errorf("pull policy %q: use missing, always or never", s)
}

// Image is a local image as a backend resolved it for a run.
type Image struct {
	// Ref is the reference the run asked for.
	Ref string `json:"ref"`
	// ID is the local image ID (sha256:...).
	ID string `json:"id"`
	// RepoDigest is the image's digest in the registry it came from, as
	// name@sha256:..., when it came from a registry under Ref's name;
	// empty for an image built locally.
	RepoDigest string `json:"repo_digest,omitempty"`
	// Pulled is set when the backend pulled the image for this run.
	Pulled bool `json:"pulled,omitempty"`
	// Labels are the image's configured labels (LABEL in its Dockerfile),
	// such as changeset.LabelExclude.
	Labels map[string]string `json:"labels,omitempty"`
}

// Digest is what a run record names the image by: the repo digest when the
// image came from a registry, else its local ID.
func (i Image) Digest() string {
	if i.RepoDigest != "" {
		return i.RepoDigest
	}
	return i.ID
}

// ImageResolver is implemented by backends that make a run's image available
// before anything of the run is created: they look it up locally and pull
// it from its registry when the policy says so. Callers use it to refuse a
// run early with a clear error (wrapping ErrImageNotFound, ErrImagePull or
// ErrRegistryAuth) and to record which image the run used.
type ImageResolver interface {
	ResolveImage(ctx context.Context, ref string, pull PullPolicy) (Image, error)
}
