package egress

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/images"
	"github.com/taskrun/taskrun/internal/dockertest"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/internal/testdeadline"
)

// containerDir is where the proxy's socket and CA appear inside the container.
const containerDir = "/taskrun/.gateway"

// dockerClient returns a client, or skips when no engine or test image is here.
func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("container test skipped in -short mode")
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	// The engine answers in moments; a loaded machine must not make the
	// tests skip as if it were missing.
	ctx, cancel := context.WithTimeout(context.Background(), testdeadline.Scale(10*time.Second))
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		t.Skipf("no Docker engine: %v", err)
	}
	if _, err := cli.ImageInspect(ctx, images.TestboxRef); err != nil {
		t.Skipf("image %s missing (make images): %v", images.TestboxRef, err)
	}
	return cli
}

// testCA issues server certificates for loopback test upstreams.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "egress test upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// server starts an HTTPS server on loopback with a certificate for name.
func (ca *testCA) server(t *testing.T, name string, h http.Handler) *httptest.Server {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// gitServer serves a one-commit repository over git's smart HTTP protocol
// (git http-backend behind net/http/cgi), answering only requests that
// carry wantAuth.
func gitServer(t *testing.T, wantAuth string) http.Handler {
	t.Helper()
	backend, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Skipf("git is not installed: %v", err)
	}
	root := t.TempDir()
	work := filepath.Join(root, "work")
	gitEnv := append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_NOSYSTEM=1", "HOME="+root)
	for _, args := range [][]string{
		{"init", "-q", "-b", "main", work},
		{"-C", work, "commit", "-q", "--allow-empty", "-m", "hello from the git server"},
		{"clone", "-q", "--bare", work, filepath.Join(root, "repo.git")},
	} {
		cmd := exec.Command("git", args...)
		cmd.Env = gitEnv
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
	}
	cgiHandler := &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(backend)), "git-http-backend"),
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != wantAuth {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "credential required", http.StatusUnauthorized)
			return
		}
		cgiHandler.ServeHTTP(w, r)
	})
}

// gitImage builds an image with the host's git (and the shared libraries
// it and git-remote-https load) on top of the test box, and removes it at
// the end of the test.
func gitImage(t *testing.T, cli *client.Client) string {
	t.Helper()
	execPath, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Skipf("git is not installed: %v", err)
	}
	core := strings.TrimSpace(string(execPath))
	gitBin, err := exec.LookPath("git")
	require.NoError(t, err)
	files := map[string]string{
		"rootfs/usr/bin/git":                       gitBin,
		"rootfs/usr/lib/git-core/git":              gitBin,
		"rootfs/usr/lib/git-core/git-remote-http":  filepath.Join(core, "git-remote-http"),
		"rootfs/usr/lib/git-core/git-remote-https": filepath.Join(core, "git-remote-http"),
	}
	for _, bin := range []string{gitBin, filepath.Join(core, "git-remote-http")} {
		out, err := exec.Command("ldd", bin).Output()
		require.NoError(t, err, "ldd %s", bin)
		for _, line := range strings.Split(string(out), "\n") {
			fields := strings.Fields(line)
			for _, f := range fields {
				if strings.HasPrefix(f, "/") {
					files["rootfs"+f] = f
				}
			}
		}
	}
	ref := fmt.Sprintf("taskrun/egress-git:test-%d", time.Now().UnixNano())
	def := images.Definition{
		Ref: ref,
		DockerfileText: []byte("FROM " + images.TestboxRef + "\nCOPY rootfs/ /\n" +
			"ENV GIT_EXEC_PATH=/usr/lib/git-core LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64\n" +
			"LABEL dev.taskrun.test=egress-git\n"),
		Files: files,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	require.NoError(t, images.NewBuilder(cli, &bytes.Buffer{}).Build(ctx, def))
	t.Cleanup(func() {
		_, _ = cli.ImageRemove(context.Background(), ref, image.RemoveOptions{Force: true, PruneChildren: true})
	})
	return ref
}

// runDir is a run dir the agent uid can traverse, with a home.
func runDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "home"), 0o777))
	return dir
}

// runContainer runs cmd hardened with network none, the run dir at
// /taskrun and the given host files read-only in /usr/local/bin, and
// returns stdout and stderr.
func runContainer(t *testing.T, cli *client.Client, img, runtime, dir string, bins []string, cmd, env []string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mounts := []mount.Mount{{Type: mount.TypeBind, Source: dir, Target: "/taskrun"}}
	for _, b := range bins {
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: b, Target: "/usr/local/bin/" + filepath.Base(b), ReadOnly: true})
	}
	return dockertest.Run(ctx, t, cli, &container.Config{
		Image:      img,
		User:       "10001:10001",
		Cmd:        cmd,
		Env:        append([]string{"HOME=/taskrun/home", "PATH=/usr/local/bin:/usr/bin:/bin"}, env...),
		WorkingDir: "/taskrun/home",
		Labels:     map[string]string{"dev.taskrun.managed": "true", "dev.taskrun.test": "egress"},
	}, &container.HostConfig{
		Runtime:        runtime,
		NetworkMode:    "none",
		ReadonlyRootfs: true,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		Tmpfs:          map[string]string{"/tmp": "rw,nosuid,nodev,size=64m"},
		Mounts:         mounts,
	})
}

// buildHTTPGet builds the static Go client the container runs.
func buildHTTPGet(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "httpget")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/httpget")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "build httpget: %s", out)
	return bin
}

// sandboxScript runs inside the container behind the relay: busybox wget
// and the Go client through the proxy, then everything a process there can
// see that might hold a secret.
const sandboxScript = `
echo "== wget allowed"; wget -q -O - "http://web.test:$WEB_PORT/hello" 2>&1; echo
echo "== wget denied"; wget -S -O - "http://denied.test:$WEB_PORT/x" 2>&1
echo "== go"; httpget "https://api.test:$API_PORT/user" "https://denied.test:$API_PORT/" 2>&1
echo "== git"; if command -v git >/dev/null; then git clone -q "https://git.test:$GIT_PORT/repo.git" /tmp/clone 2>&1 && git -C /tmp/clone log --format=%s 2>&1; fi
echo "== netdev"; cat /proc/net/dev
echo "== env"; env
echo "== proc"; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' '\n' < "$f"; echo; done
echo "== files"; cat /taskrun/.gateway/* 2>/dev/null | grep -c CERTIFICATE; grep -r . /taskrun /tmp 2>/dev/null | grep -v '^/taskrun/.gateway/.*\.pem' | head -200
echo "== end"
`

func TestContainerEgressThroughRelay(t *testing.T) {
	cli := dockerClient(t)
	info, err := cli.Info(context.Background())
	require.NoError(t, err)
	relay := filepath.Join(testbin.Dir(t), "taskrun-relay")
	httpget := buildHTTPGet(t)
	gitImg := gitImage(t, cli)
	for _, runtime := range []string{"runc", "runsc"} {
		t.Run(runtime, func(t *testing.T) {
			if _, ok := info.Runtimes[runtime]; !ok {
				t.Skipf("runtime %s is not registered with the engine", runtime)
			}
			checkContainerEgress(t, cli, gitImg, runtime, relay, httpget)
		})
	}
}

func checkContainerEgress(t *testing.T, cli *client.Client, img, runtime, relay, httpget string) {
	ca := newTestCA(t)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "web says hello to %s", r.URL.Path)
	}))
	t.Cleanup(web.Close)
	seenAuth := make(chan string, 4)
	api := ca.server(t, "api.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenAuth <- r.Header.Get("Authorization")
		fmt.Fprintf(w, `{"login":"octo","path":%q}`, r.URL.Path)
	}))
	git := ca.server(t, "git.test", gitServer(t, "Bearer "+canary))
	webPort, apiPort, gitPort := portOf(t, web.URL), portOf(t, api.URL), portOf(t, git.URL)

	dir := runDir(t)
	record, logs := &lockedbuf.Buffer{}, &lockedbuf.Buffer{}
	pol := Policy{
		Rules: []Rule{
			{Host: "web.test", Port: webPort}, {Host: "api.test", Port: apiPort}, {Host: "git.test", Port: gitPort},
			{Host: "127.0.0.1", Port: webPort}, {Host: "127.0.0.1", Port: apiPort}, {Host: "127.0.0.1", Port: gitPort},
		},
		Credentials: []Credential{
			{Host: "api.test", Header: "Authorization", ValueEnv: "TEST_CANARY", Format: "token %s"},
			{Host: "git.test", Header: "Authorization", ValueEnv: "TEST_CANARY", Format: "Bearer %s"},
		},
	}
	p, err := Start(context.Background(), Config{
		SocketPath:    filepath.Join(dir, ".gateway", SocketName),
		Policy:        pol,
		Record:        record,
		Logger:        slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Resolver:      resolverFor(map[string]string{"web.test": "127.0.0.1", "api.test": "127.0.0.1", "git.test": "127.0.0.1", "denied.test": "127.0.0.1"}),
		UpstreamRoots: ca.pool,
		Getenv:        func(k string) string { return map[string]string{"TEST_CANARY": canary}[k] },
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	env := append(p.ContainerEnv(containerDir),
		fmt.Sprintf("WEB_PORT=%d", webPort), fmt.Sprintf("API_PORT=%d", apiPort), fmt.Sprintf("GIT_PORT=%d", gitPort))
	stdout, stderr := runContainer(t, cli, img, runtime, dir, []string{relay, httpget},
		[]string{"/usr/local/bin/taskrun-relay", "--", "/bin/sh", "-c", sandboxScript}, env)
	out := stdout + stderr
	require.Contains(t, stdout, "== end", "stdout: %s\nstderr: %s", stdout, stderr)

	// busybox wget: the allowed host answers; the other gets a 403 with the reason.
	assert.Equal(t, "web says hello to /hello", strings.TrimSpace(section(stdout, "wget allowed")))
	denied := section(stdout, "wget denied")
	assert.Contains(t, denied, "403 Forbidden by taskrun egress policy")
	assert.Contains(t, denied, fmt.Sprintf("no rule allows denied.test:%d", webPort), denied)
	// Go's net/http client: HTTPS through the intercepting proxy with the brokered credential.
	goOut := section(stdout, "go")
	assert.Contains(t, goOut, fmt.Sprintf("GET https://api.test:%d/user: 200\n{\"login\":\"octo\",\"path\":\"/user\"}", apiPort), goOut)
	assert.Equal(t, "token "+canary, <-seenAuth, "the upstream got the credential")
	assert.Contains(t, goOut, fmt.Sprintf("GET https://denied.test:%d/: error", apiPort), "a refused CONNECT fails the client")
	assert.Contains(t, goOut, fmt.Sprintf("Forbidden by taskrun egress policy: no rule allows denied.test:%d", apiPort), "the client's error names the reason")
	// git clone over HTTPS, authenticated by the brokered credential.
	assert.Contains(t, section(stdout, "git"), "hello from the git server", "git: %s", section(stdout, "git"))
	// The container's only interface is loopback.
	assert.Equal(t, []string{"lo"}, interfaces(section(stdout, "netdev")))

	require.NoError(t, p.Close())
	// The canary is nowhere in the sandbox's view, the record, the log or the run dir.
	assert.NotEmpty(t, section(stdout, "proc"))
	assert.NotContains(t, out, canary)
	assert.NotContains(t, record.String(), canary)
	assert.NotContains(t, logs.String(), canary)
	assertNoFileContains(t, dir, canary)

	var hosts []string
	for _, line := range strings.Split(strings.TrimSpace(record.String()), "\n") {
		if strings.Contains(line, `"decision":"deny"`) {
			hosts = append(hosts, "deny:"+between(line, `"host":"`, `"`))
		} else {
			hosts = append(hosts, "allow:"+between(line, `"host":"`, `"`))
		}
	}
	assert.Contains(t, hosts, "allow:web.test")
	assert.Contains(t, hosts, "deny:denied.test")
	assert.Contains(t, hosts, "allow:api.test")
	assert.Contains(t, hosts, "allow:git.test")
}

// section returns the lines the script printed after "== name".
func section(out, name string) string {
	_, rest, ok := strings.Cut(out, "== "+name+"\n")
	if !ok {
		return ""
	}
	body, _, _ := strings.Cut(rest, "\n== ")
	return body
}

// between returns the text of s between the first start and the next end.
func between(s, start, end string) string {
	_, rest, _ := strings.Cut(s, start)
	v, _, _ := strings.Cut(rest, end)
	return v
}

// interfaces lists the interface names in /proc/net/dev output.
func interfaces(netdev string) []string {
	var names []string
	for _, line := range strings.Split(netdev, "\n") {
		name, _, ok := strings.Cut(line, ":")
		if ok && !strings.Contains(name, "|") {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names
}
