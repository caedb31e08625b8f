package taskruntest_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/integration/taskruntest"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/uidpool"
)

// openEnv opens an Env of opts under a test directory, closed at cleanup.
func openEnv(t *testing.T, opts taskruntest.EnvOptions) *taskruntest.Env {
	t.Helper()
	opts.Dir = t.TempDir()
	env, err := taskruntest.OpenEnv(context.Background(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Close(context.Background())) })
	return env
}

// By default a run's agent has a host uid of its own and starts behind the
// self-check, whose report is in the run's isolation record; SharedUID and
// NoSelfCheck opt out.
func TestRunIsSecureByDefault(t *testing.T) {
	ctx := context.Background()
	res, err := taskruntest.Run(ctx, t, taskruntest.Options{Image: testboxImage, Cmd: []string{"id", "-u"}})
	require.NoError(t, err)
	uid, err := strconv.Atoi(strings.TrimSpace(string(res.Stream)))
	require.NoError(t, err)
	r := uidpool.DefaultRange()
	assert.True(t, uid >= r.First && uid <= r.Last, "uid %d is from the pool %s", uid, r)
	rec, err := res.AuditRecord(ctx)
	require.NoError(t, err)
	require.NotNil(t, rec.Probe, "the self-check ran")
	assert.Equal(t, uid, rec.Probe.UID)
	assert.Empty(t, rec.ProbeContradictions)

	env := openEnv(t, taskruntest.EnvOptions{SharedUID: true, NoSelfCheck: true})
	res, err = env.Run(ctx, taskruntest.Options{Image: testboxImage, Cmd: []string{"id", "-u"}})
	require.NoError(t, err)
	assert.Equal(t, "10001\n", string(res.Stream))
	rec, err = res.AuditRecord(ctx)
	require.NoError(t, err)
	assert.Nil(t, rec.Probe, "no self-check")
}

// EnvOptions.HelpersDir names the helpers without $TASKRUN_BIN_DIR.
func TestHelpersDirOption(t *testing.T) {
	dir := os.Getenv(taskruntest.HelpersDirEnv)
	t.Setenv(taskruntest.HelpersDirEnv, "")
	env := openEnv(t, taskruntest.EnvOptions{HelpersDir: dir})
	res, err := env.Run(t.Context(), taskruntest.Options{Image: testboxImage, Cmd: []string{"true"}})
	require.NoError(t, err)
	rec, err := res.AuditRecord(t.Context())
	require.NoError(t, err)
	assert.NotNil(t, rec.Probe, "the self-check ran with the named helpers")
}

func TestOpenEnvWithoutHelpersNamesTheFix(t *testing.T) {
	t.Setenv(taskruntest.HelpersDirEnv, "")
	_, err := taskruntest.OpenEnv(context.Background(), taskruntest.EnvOptions{Dir: t.TempDir()})
	if err == nil {
		t.Skip("the test binary is static and serves as its own helpers")
	}
	require.ErrorIs(t, err, taskruntest.ErrBadOptions)
	assert.ErrorContains(t, err, "TASKRUN_BIN_DIR")
	assert.ErrorContains(t, err, "NoSelfCheck")
}

func TestEntrypointReplacesTheImages(t *testing.T) {
	res, err := taskruntest.Run(context.Background(), t, taskruntest.Options{
		Image: testboxImage, Entrypoint: []string{"/bin/echo", "from-entrypoint"}, Cmd: []string{"arg"},
	})
	require.NoError(t, err)
	assert.Equal(t, "from-entrypoint arg\n", string(res.Stream))
}

// A loopback service on this host is reached through the run's egress
// proxy once a rule names its IP literal; anything else gets the proxy's
// 403 naming the --allow that would permit it.
func TestEgressAllowsAListedLoopbackService(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	port := portOf(t, srv.URL)
	other := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(other.Close)
	otherPort := portOf(t, other.URL)

	res, err := taskruntest.Run(context.Background(), t, taskruntest.Options{
		Image: testboxImage,
		// busybox wget sends every URL, loopback too, to $http_proxy.
		Cmd:    []string{"sh", "-c", fmt.Sprintf(`wget -q -O - http://127.0.0.1:%d/hello; echo; echo ==; wget -O - http://127.0.0.1:%d/ 2>&1; true`, port, otherPort)},
		Egress: egress.Policy{Rules: []egress.Rule{{Host: "127.0.0.1", Port: port}}},
	})
	require.NoError(t, err)
	allowed, denied, _ := strings.Cut(string(res.Stream), "==")
	assert.Equal(t, "hello /hello", strings.TrimSpace(allowed))
	assert.Contains(t, denied, "403")
	rec, err := res.AuditRecord(t.Context())
	require.NoError(t, err)
	require.NotNil(t, rec.Egress, "the run's egress is in its isolation record")
}

// A credential is brokered to a loopback HTTPS service under a private CA
// (httptest's own): refused, with the --egress-ca fix, while the proxy
// trusts only the system roots; with EnvOptions.EgressRoots the service
// gets the header, and the agent never sees its value.
func TestEgressBrokersACredentialToAPrivateCAService(t *testing.T) {
	const canary = "taskruntest-canary-5d1e"
	t.Setenv("TASKRUNTEST_TOKEN", canary)
	seen := make(chan string, 4)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Authorization")
		fmt.Fprint(w, "private api")
	}))
	t.Cleanup(srv.Close)
	port := portOf(t, srv.URL)
	img := proxygetImage(t)
	pol := egress.Policy{
		Rules:       []egress.Rule{{Host: "127.0.0.1", Port: port}},
		Credentials: []egress.Credential{{Host: "127.0.0.1", Header: "Authorization", ValueEnv: "TASKRUNTEST_TOKEN", Format: "Bearer %s"}},
	}
	opts := taskruntest.Options{Image: img, Cmd: []string{"sh", "-c", fmt.Sprintf("/usr/local/bin/proxyget https://127.0.0.1:%d/v1 || echo failed", port)}, Egress: pol}

	res, err := openEnv(t, taskruntest.EnvOptions{}).Run(t.Context(), opts)
	require.NoError(t, err)
	assert.Contains(t, string(res.Stream), ": 403", "refused")
	assert.Contains(t, string(res.Stream), "--egress-ca FILE")
	assert.Empty(t, seen, "nothing reached the service")

	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	res, err = openEnv(t, taskruntest.EnvOptions{EgressRoots: roots}).Run(t.Context(), opts)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("GET https://127.0.0.1:%d/v1: 200\nprivate api\n", port), string(res.Stream))
	assert.Equal(t, "Bearer "+canary, <-seen)
	assert.Equal(t, model.StatusSucceeded, res.Status)
	assert.NotContains(t, string(res.Stream), canary)
}

// proxygetImage is the testbox with testdata/proxyget, removed at cleanup.
func proxygetImage(t *testing.T) string {
	t.Helper()
	bin, err := taskruntest.BuildStatic(t.Context(), t.TempDir(), "./testdata/proxyget")
	require.NoError(t, err)
	img, err := taskruntest.BuildImage(t.Context(), taskruntest.ImageSource{
		Repo:       "taskruntest/proxyget",
		Dockerfile: "FROM " + testboxImage + "\nCOPY proxyget /usr/local/bin/proxyget\n",
		Files:      map[string]string{"proxyget": bin},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, img.Remove(context.Background())) })
	return img.Ref
}

func portOf(t *testing.T, u string) int {
	t.Helper()
	pu, err := url.Parse(u)
	require.NoError(t, err)
	port, err := strconv.Atoi(pu.Port())
	require.NoError(t, err)
	return port
}

// The agent reaches its model through taskrun-relay and the run's gateway,
// which holds the key: the upstream (a loopback fake) gets it, the agent
// never sees it, and the tokens are metered.
func TestModelIsReachedThroughTheRelay(t *testing.T) {
	const key = "sk-taskruntest-canary-81f0"
	t.Setenv("TASKRUNTEST_MODEL_KEY", key)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+key {
			http.Error(w, `{"error":"bad key"}`, http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"model says hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}`)
	}))
	t.Cleanup(upstream.Close)

	res, err := taskruntest.Run(t.Context(), t, taskruntest.Options{
		Image: testboxImage,
		Cmd: []string{"/.taskrun/bin/taskrun-relay", "--", "sh", "-c",
			`wget -q -O - --header "Content-Type: application/json" --post-data '{"model":"m","messages":[{"role":"user","content":"hi"}]}' "$OPENAI_BASE_URL/chat/completions"; echo; env`},
		Model: config.ModelEntry{Provider: config.ProviderOpenAI, Name: "gpt-test", BaseURL: upstream.URL, APIKeyEnv: "TASKRUNTEST_MODEL_KEY"},
	})
	require.NoError(t, err)
	assert.Contains(t, string(res.Stream), "model says hi")
	assert.NotContains(t, string(res.Stream), key)
	require.NotNil(t, res.Final().PromptTokens)
	assert.Equal(t, 11, *res.Final().PromptTokens, "the gateway metered the tokens")
}
