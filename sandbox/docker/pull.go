package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/cpuguy83/dockercfg"
	"github.com/distribution/reference"
	dockerimage "github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/registry"
	"github.com/docker/docker/pkg/jsonmessage"

	"github.com/taskrun/taskrun/sandbox"
)

// WithPullProgress shows image pulls on w as `docker pull` does (a progress
// bar per layer) when w is the terminal whose file descriptor is fd. Without
// it, or when isTerminal is false, a pull is summarised on the backend's log
// (its start, each layer done, its end), never one line per chunk.
func WithPullProgress(w io.Writer, fd uintptr, isTerminal bool) Option {
	return func(b *Backend) {
		if isTerminal {
			b.progress, b.progressFd = w, fd
		}
	}
}

// DefaultPullTimeout bounds one image pull, so a registry that stops
// answering cannot hold a run (and its slot) forever.
const DefaultPullTimeout = 15 * time.Minute

// WithPullTimeout bounds each image pull (DefaultPullTimeout by default).
func WithPullTimeout(d time.Duration) Option { return func(b *Backend) { b.pullTimeout = d } }

// WithDockerConfig reads registry credentials from the docker CLI config in
// dir (its config.json, credsStore and credHelpers) instead of the one named
// by DOCKER_CONFIG or ~/.docker.
func WithDockerConfig(dir string) Option { return func(b *Backend) { b.dockerConfig = dir } }

// ResolveImage makes ref available locally under the pull policy and
// returns its ID and repo digest (sandbox.ImageResolver). A pull
// authenticates as the docker CLI would: with the credentials of ref's
// registry in the docker config (auths, credsStore, credHelpers). Errors
// wrap sandbox.ErrImageNotFound, sandbox.ErrRegistryAuth,
// sandbox.ErrImagePull or sandbox.ErrDaemonUnavailable and name the fix.
func (b *Backend) ResolveImage(ctx context.Context, ref string, pull sandbox.PullPolicy) (sandbox.Image, error) {
	img := sandbox.Image{Ref: ref}
	named, nameErr := reference.ParseNormalizedNamed(ref)
	if pull != sandbox.PullAlways {
		info, err := b.api.ImageInspect(ctx, ref)
		switch {
		case err == nil:
			img.ID, img.RepoDigest, img.Labels = info.ID, repoDigest(named, info), imageLabels(info)
			return img, nil
		case isConnectionFailed(err):
			return img, b.createError(sandbox.Spec{Image: ref}, err)
		case !isNotFound(err):
			return img, fmt.Errorf("inspect image %q: %w", ref, err)
		case pull == sandbox.PullNever:
			return img, fmt.Errorf("%w locally: %q, and the pull policy is never; build it (`taskrun images build` makes taskrun's own) or pull it, or run with --pull missing",
				sandbox.ErrImageNotFound, ref)
		}
	}
	if nameErr != nil {
		return img, fmt.Errorf("%w: %q is not a name a registry serves (%w); give REPOSITORY[:TAG] or REPOSITORY@sha256:DIGEST",
			sandbox.ErrImagePull, ref, nameErr)
	}
	if err := b.pull(ctx, named); err != nil {
		return img, err
	}
	info, err := b.api.ImageInspect(ctx, ref)
	if err != nil {
		return img, fmt.Errorf("%w: %q was pulled but cannot be inspected: %w", sandbox.ErrImagePull, ref, err)
	}
	img.ID, img.RepoDigest, img.Pulled, img.Labels = info.ID, repoDigest(named, info), true, imageLabels(info)
	return img, nil
}

// imageLabels are the labels of the image's configuration.
func imageLabels(info dockerimage.InspectResponse) map[string]string {
	if info.Config == nil {
		return nil
	}
	return info.Config.Labels
}

// pull pulls named from its registry, authenticated from the docker config,
// showing progress on the terminal or summarising it on the log.
func (b *Backend) pull(ctx context.Context, named reference.Named) error {
	ref := reference.FamiliarString(reference.TagNameOnly(named))
	domain := reference.Domain(named)
	auth, err := b.registryAuth(domain)
	if err != nil {
		return fmt.Errorf("%w: pull %s: %w", sandbox.ErrRegistryAuth, ref, err)
	}
	b.log.InfoContext(ctx, "pulling image", "image", ref, "registry", domain, "authenticated", auth != "")
	started := time.Now()
	timeout := b.pullTimeout
	if timeout <= 0 {
		timeout = DefaultPullTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, err := b.api.ImagePull(ctx, ref, dockerimage.PullOptions{RegistryAuth: auth})
	if err == nil {
		defer body.Close()
		if b.progress != nil {
			err = jsonmessage.DisplayJSONMessagesStream(body, b.progress, b.progressFd, true, nil)
		} else {
			err = summarisePull(ctx, b.log, ref, body)
		}
	}
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: pull %s: no answer within %s: %w; check that %s is reachable from the Docker engine", sandbox.ErrImagePull, ref, timeout, err, domain)
	}
	if err != nil {
		return b.pullError(ref, domain, auth != "", err)
	}
	b.log.InfoContext(ctx, "pulled image", "image", ref, "duration", time.Since(started).Round(time.Millisecond))
	return nil
}

// pullError explains a failed pull: the registry refused the credentials,
// has no such image, or could not be reached.
func (b *Backend) pullError(ref, domain string, authenticated bool, err error) error {
	var jerr *jsonmessage.JSONError
	msg := err.Error()
	switch {
	case isConnectionFailed(err):
		return fmt.Errorf("%w: pull %s: %w at %s: %w; start dockerd or set DOCKER_HOST",
			sandbox.ErrImagePull, ref, sandbox.ErrDaemonUnavailable, b.api.DaemonHost(), err)
	case isUnauthorized(err) || errors.As(err, &jerr) && jerr.Code == 401 || mentionsUnauthorized(msg):
		how := "log in with `docker login " + domain + "` (or set DOCKER_CONFIG to a config that holds its credentials)"
		if authenticated {
			how = "the credentials for " + domain + " in the docker config were refused: log in again with `docker login " + domain + "`"
		}
		return fmt.Errorf("%w: pull %s: %w; %s", sandbox.ErrRegistryAuth, ref, err, how)
	case isNotFound(err) || errors.As(err, &jerr) && jerr.Code == 404 || mentionsNotFound(msg):
		return fmt.Errorf("%w: pull %s: %w; check the repository and tag (or digest) exist in %s", sandbox.ErrImageNotFound, ref, err, domain)
	}
	return fmt.Errorf("%w: pull %s: %w; check that %s is reachable from the Docker engine", sandbox.ErrImagePull, ref, err, domain)
}

// mentionsUnauthorized and mentionsNotFound recognise the registry's
// refusals (distribution's UNAUTHORIZED, DENIED, MANIFEST_UNKNOWN,
// NAME_UNKNOWN, and the engine's own "no basic auth credentials") where the
// engine passes them on only as text: Docker 20.10 answers a refused pull
// with a 500 whose message is the registry's, or puts it in the progress
// stream. The engine's typed errors are checked first.
func mentionsUnauthorized(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "unauthorized") || strings.Contains(m, "authentication required") ||
		strings.Contains(m, "no basic auth credentials") || strings.Contains(m, "denied:")
}

func mentionsNotFound(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "manifest unknown") || strings.Contains(m, "not found") || strings.Contains(m, "name unknown")
}

// registryAuth returns the engine's X-Registry-Auth value for domain from
// the docker config, or "" when it holds no credentials for it.
func (b *Backend) registryAuth(domain string) (string, error) {
	var cfg dockercfg.Config
	path, err := b.dockerConfigPath()
	if err == nil {
		err = dockercfg.FromFile(path, &cfg)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("docker config %s: %w; fix the file or point DOCKER_CONFIG at a directory with a valid config.json", path, err)
	}
	host := dockercfg.ResolveRegistryHost(domain)
	user, secret, err := cfg.GetRegistryCredentials(host)
	if err != nil {
		return "", fmt.Errorf("credentials for %s from the docker config %s: %w", host, path, err)
	}
	if user == "" && secret == "" {
		return "", nil
	}
	ac := registry.AuthConfig{Username: user, Password: secret, ServerAddress: host}
	if user == "" {
		ac = registry.AuthConfig{IdentityToken: secret, ServerAddress: host}
	}
	return registry.EncodeAuthConfig(ac)
}

// dockerConfigPath is the docker CLI config file the backend reads.
func (b *Backend) dockerConfigPath() (string, error) {
	if b.dockerConfig != "" {
		return filepath.Join(b.dockerConfig, "config.json"), nil
	}
	return dockercfg.ConfigPath()
}

// repoDigest returns the digest under named's repository of the image info
// describes (name@sha256:...), or "" when it did not come from there.
func repoDigest(named reference.Named, info dockerimage.InspectResponse) string {
	if named == nil {
		return ""
	}
	if c, ok := named.(reference.Canonical); ok {
		return reference.FamiliarName(named) + "@" + c.Digest().String()
	}
	for _, rd := range info.RepoDigests {
		if n, err := reference.ParseNormalizedNamed(rd); err == nil && n.Name() == named.Name() {
			return rd
		}
	}
	return ""
}

// summarisePull reads a pull's progress stream and logs its start, each
// layer done and its outcome: a bounded number of lines, whatever the
// number of progress messages.
func summarisePull(ctx context.Context, log *slog.Logger, ref string, body io.Reader) error {
	dec := json.NewDecoder(body)
	layers := map[string]bool{}
	var done int
	var bytes int64
	sizes := map[string]int64{}
	for {
		var m jsonmessage.JSONMessage
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("read pull progress: %w", err)
		}
		if m.Error != nil {
			return m.Error
		}
		switch {
		case m.ID != "" && m.Progress != nil && m.Progress.Total > 0 && strings.HasPrefix(m.Status, "Downloading"):
			layers[m.ID] = layers[m.ID] || false
			sizes[m.ID] = m.Progress.Total
		case m.ID != "" && (m.Status == "Pull complete" || m.Status == "Already exists"):
			if !layers[m.ID] {
				layers[m.ID] = true
				done++
				bytes += sizes[m.ID]
				log.DebugContext(ctx, "pulling image", "image", ref, "layer", m.ID, "status", m.Status, "layers_done", done)
			}
		case m.ID == "" && (strings.HasPrefix(m.Status, "Digest:") || strings.HasPrefix(m.Status, "Status:")):
			log.InfoContext(ctx, "pulling image", "image", ref, "status", m.Status, "layers", done, "downloaded_bytes", bytes)
		}
	}
	return nil
}
