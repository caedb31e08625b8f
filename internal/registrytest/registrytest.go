// Package registrytest runs a real image registry (distribution's
// `registry`, built from the Go module proxy by
// scripts/test-setup.d/50-registry) on 127.0.0.1 for tests that pull images,
// with htpasswd authentication and its storage in a temporary directory.
//
// The Docker engine treats registries on 127.0.0.0/8 as insecure (plain
// HTTP) by default, so it pulls from this one without TLS.
//
// Without the binary, tests that need it are skipped, unless
// TASKRUN_REQUIRE_REGISTRY=1 (as in CI), in which case they fail.
package registrytest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/build"
	dockerimage "github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/registry"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/jsonmessage"
	"golang.org/x/crypto/bcrypt"

	"github.com/taskrun/taskrun/images"
)

// RequireEnv names the environment variable that turns a missing registry
// binary from a skip into a failure when set to "1".
const RequireEnv = "TASKRUN_REQUIRE_REGISTRY"

// BinaryEnv names a registry binary to use instead of the setup hook's.
const BinaryEnv = "TASKRUN_REGISTRY_BIN"

// User is the account the registry accepts; its password is per registry.
const User = "taskrun-test"

// readyWait bounds how long Start waits for the registry to answer.
const readyWait = 60 * time.Second

// ErrNoBinary is returned by Start when no registry binary is installed.
var ErrNoBinary = errors.New("registry binary not installed: run scripts/test-setup.sh (its hook test-setup.d/50-registry builds it) or set " + BinaryEnv)

// Registry is a running registry.
type Registry struct {
	// Addr is its host:port on 127.0.0.1, the registry part of image names.
	Addr string
	// Password is User's password.
	Password string

	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
	log    *syncBuffer
	once   sync.Once
}

// Binary returns the registry binary: $TASKRUN_REGISTRY_BIN, else the setup
// hook's link under /var/cache/taskrun or ~/.cache/taskrun.
func Binary() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		return p, nil
	}
	candidates := []string{"/var/cache/taskrun/bin/registry"}
	if home, err := os.UserHomeDir(); err == nil {
		cache := filepath.Join(home, ".cache")
		if x := os.Getenv("XDG_CACHE_HOME"); x != "" {
			cache = x
		}
		candidates = append(candidates, filepath.Join(cache, "taskrun", "bin", "registry"))
	}
	for _, c := range candidates {
		if info, err := os.Stat(c); err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", ErrNoBinary
}

// Required reports whether a missing binary must fail the tests.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Start runs a registry on a free 127.0.0.1 port with htpasswd auth for
// User and a random password, its storage in a new temporary directory.
// Close stops it and removes the directory.
func Start(ctx context.Context) (*Registry, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "taskrun-registry-")
	if err != nil {
		return nil, err
	}
	r := &Registry{dir: dir, exited: make(chan struct{}), log: &syncBuffer{}}
	if err := r.start(ctx, bin); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Registry) start(ctx context.Context, bin string) error {
	pw := make([]byte, 18)
	if _, err := rand.Read(pw); err != nil {
		return err
	}
	r.Password = base64.RawURLEncoding.EncodeToString(pw)
	hash, err := bcrypt.GenerateFromPassword([]byte(r.Password), bcrypt.MinCost)
	if err != nil {
		return err
	}
	htpasswd := filepath.Join(r.dir, "htpasswd")
	if err := os.WriteFile(htpasswd, []byte(User+":"+string(hash)+"\n"), 0o600); err != nil {
		return err
	}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	r.Addr = addr
	config := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
auth:
  htpasswd:
    realm: taskrun-test
    path: %s
`, filepath.Join(r.dir, "storage"), addr, htpasswd)
	cfgPath := filepath.Join(r.dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		return err
	}
	r.cmd = exec.Command(bin, "serve", cfgPath)
	r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
	r.cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	if err := r.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	go func() { _ = r.cmd.Wait(); close(r.exited) }()
	return r.waitReady(ctx)
}

// waitReady waits until the registry answers /v2/ (401 without
// credentials) or exits.
func (r *Registry) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.Addr+"/v2/", nil)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
		}
		select {
		case <-r.exited:
			return fmt.Errorf("registry exited before answering: %s", r.log.String())
		case <-ctx.Done():
			return fmt.Errorf("registry did not answer on %s: %w: %s", r.Addr, ctx.Err(), r.log.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close stops the registry and removes its storage.
func (r *Registry) Close() {
	r.once.Do(func() {
		if r.cmd != nil && r.cmd.Process != nil {
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
		_ = os.RemoveAll(r.dir)
	})
}

// WriteDockerConfig writes a docker CLI config.json into dir that holds
// user and password for the registry (as `docker login` does without a
// credential store) and returns dir.
func (r *Registry) WriteDockerConfig(dir, user, password string) (string, error) {
	cfg := map[string]any{"auths": map[string]any{
		r.Addr: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))},
	}}
	data, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600)
}

// Auth is the engine's X-Registry-Auth value for User.
func (r *Registry) Auth() string {
	s, _ := registry.EncodeAuthConfig(registry.AuthConfig{Username: User, Password: r.Password, ServerAddress: r.Addr})
	return s
}

// Pushed is an image pushed into the registry.
type Pushed struct {
	// Ref is ADDR/REPO:TAG; Digest is ADDR/REPO@sha256:...
	Ref, Digest string
	// ID is the image ID.
	ID string
}

// BuildAndPush builds a small image FROM base with a file unique to it (so
// a pull downloads a layer of its own), pushes it as ADDR/repo:tag with the
// Docker API, authenticated, and removes every local name of it: the image
// then exists only in the registry.
func (r *Registry) BuildAndPush(ctx context.Context, cli *client.Client, base, repo, tag string) (Pushed, error) {
	ref := r.Addr + "/" + repo + ":" + tag
	marker := filepath.Join(r.dir, "marker-"+strings.ReplaceAll(repo, "/", "_")+"-"+tag)
	if err := os.WriteFile(marker, []byte(ref+" "+time.Now().String()), 0o644); err != nil {
		return Pushed{}, err
	}
	var buf bytes.Buffer
	def := images.Definition{
		DockerfileText: []byte("FROM " + base + "\nCOPY marker /marker\n"),
		Files:          map[string]string{"marker": marker},
	}
	if err := images.WriteContext(def, &buf); err != nil {
		return Pushed{}, err
	}
	resp, err := cli.ImageBuild(ctx, &buf, build.ImageBuildOptions{Tags: []string{ref}, Remove: true, ForceRemove: true})
	if err != nil {
		return Pushed{}, fmt.Errorf("build %s: %w", ref, err)
	}
	err = jsonmessage.DisplayJSONMessagesStream(resp.Body, io.Discard, 0, false, nil)
	resp.Body.Close()
	if err != nil {
		return Pushed{}, fmt.Errorf("build %s: %w", ref, err)
	}
	push, err := cli.ImagePush(ctx, ref, dockerimage.PushOptions{RegistryAuth: r.Auth()})
	if err != nil {
		return Pushed{}, fmt.Errorf("push %s: %w", ref, err)
	}
	err = jsonmessage.DisplayJSONMessagesStream(push, io.Discard, 0, false, nil)
	push.Close()
	if err != nil {
		return Pushed{}, fmt.Errorf("push %s: %w", ref, err)
	}
	info, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		return Pushed{}, err
	}
	p := Pushed{Ref: ref, ID: info.ID}
	for _, d := range info.RepoDigests {
		if strings.HasPrefix(d, r.Addr+"/"+repo+"@") {
			p.Digest = d
		}
	}
	if p.Digest == "" {
		return p, fmt.Errorf("push %s: no repo digest in %v", ref, info.RepoDigests)
	}
	if err := RemoveImage(ctx, cli, p.ID); err != nil {
		return p, err
	}
	return p, nil
}

// RemoveImage removes the image id and every name it has; an image that is
// already gone is not an error.
func RemoveImage(ctx context.Context, cli *client.Client, id string) error {
	_, err := cli.ImageRemove(ctx, id, dockerimage.RemoveOptions{Force: true, PruneChildren: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove image %s: %w", id, err)
	}
	return nil
}

// freeAddr returns a 127.0.0.1 address no one listens on right now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// syncBuffer collects the registry's log for error messages, bounded.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() < 64<<10 {
		b.buf.Write(p)
	}
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
