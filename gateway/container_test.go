package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/examples"
	"github.com/taskrun/taskrun/internal/dockertest"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
)

// testboxImage is the local busybox image container tests use.
const testboxImage = "taskrun/testbox:local"

// containerScript runs inside the container, behind taskrun-relay: it dumps
// everything a process there can see that might hold a key, shows the
// network interfaces, and talks to the model through the relay.
const containerScript = `
echo "== env"; env
echo "== environ"; for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f"; done
echo "== netdev"; cat /proc/net/dev
echo "== models"; wget -q -O - http://127.0.0.1:8411/v1/models
echo "== chat"; wget -q -O - --header 'Content-Type: application/json' \
  --post-data '{"model":"any","messages":[{"role":"user","content":"hi"}]}' \
  http://127.0.0.1:8411/v1/chat/completions
echo; echo "== end"
`

// dockerClient returns a client, or skips when no engine or image is here.
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
	if _, err := cli.ImageInspect(ctx, testboxImage); err != nil {
		t.Skipf("image %s missing (build images/testbox): %v", testboxImage, err)
	}
	return cli
}

// buildStatic builds a command of this module (cmd/NAME) statically into a temp dir.
func buildStatic(t *testing.T, name string) string {
	t.Helper()
	return buildStaticPkg(t, "github.com/taskrun/taskrun/cmd/"+name)
}

// buildStaticPkg builds a main package statically into a temp dir.
func buildStaticPkg(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "build %s: %s", pkg, out)
	return bin
}

// agentRunDir is a run dir the agent uid can traverse.
func agentRunDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	return dir
}

func TestContainerReachesModelOnlyThroughRelayAndNeverSeesKey(t *testing.T) {
	cli := dockerClient(t)
	info, err := cli.Info(context.Background())
	require.NoError(t, err)
	relayBin := buildStatic(t, "taskrun-relay")
	for _, runtime := range []string{"runc", "runsc"} {
		t.Run(runtime, func(t *testing.T) {
			if _, ok := info.Runtimes[runtime]; !ok {
				t.Skipf("runtime %s is not registered with the engine", runtime)
			}
			checkContainerIsolation(t, cli, relayBin, runtime)
		})
	}
}

func checkContainerIsolation(t *testing.T, cli *client.Client, relayBin, runtime string) {
	t.Setenv("TASKRUN_TEST_CANARY_KEY", testKey)
	seen := make(chan map[string]any, 8)
	up := fakeOpenAI(t, seen)
	runDir := agentRunDir(t)
	var trace lockedbuf.Buffer
	g, err := Start(context.Background(), Config{
		SocketPath: filepath.Join(runDir, ".gateway", "model.sock"),
		Model:      config.ModelEntry{Provider: config.ProviderOpenAI, Name: "gpt-test", BaseURL: up.URL + "/v1", APIKeyEnv: "TASKRUN_TEST_CANARY_KEY"},
		Trace:      &trace,
		Logger:     quietLogger,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })

	stdout, stderr := runContainer(t, cli, runtime, runDir, []string{relayBin},
		[]string{"/usr/local/bin/taskrun-relay", "--", "/bin/sh", "-c", containerScript}, nil)
	out := stdout + stderr
	require.Contains(t, stdout, "== end", "script ran to the end; stderr: %s", stderr)

	// The model answered through relay and gateway: the key was injected host-side.
	assert.Contains(t, section(stdout, "models"), `"id":"gpt-test"`)
	assert.Contains(t, section(stdout, "chat"), `"content":"hi"`, "stderr: %s", stderr)
	assert.Equal(t, "gpt-test", (<-seen)["model"])
	assert.Equal(t, Usage{PromptTokens: 11, CompletionTokens: 3, Requests: 1}, g.Usage())

	// The only interface is loopback: the relay is the one way out.
	assert.Equal(t, []string{"lo"}, interfaces(section(stdout, "netdev")))

	// The key is nowhere the agent or the run's records can see it.
	assert.NotEmpty(t, section(stdout, "environ"))
	assert.NotContains(t, out, testKey)
	assert.NotContains(t, trace.String(), testKey)
	assertNoFileContains(t, runDir, testKey)
}

// runContainer runs cmd in a hardened container with the run dir at
// /taskrun and bins mounted read-only in /usr/local/bin (or at their
// absolute path in binAt), and returns its stdout and stderr.
func runContainer(t *testing.T, cli *client.Client, runtime, runDir string, bins, cmd, env []string, binAt ...map[string]string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	testLabel := fmt.Sprintf("gateway-%d", time.Now().UnixNano())
	mounts := []mount.Mount{{Type: mount.TypeBind, Source: runDir, Target: "/taskrun"}}
	for _, bin := range bins {
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: bin, Target: "/usr/local/bin/" + filepath.Base(bin), ReadOnly: true})
	}
	for _, at := range binAt {
		for target, bin := range at {
			mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: bin, Target: target, ReadOnly: true})
		}
	}
	return dockertest.Run(ctx, t, cli, &container.Config{
		Image:      testboxImage,
		User:       "10001:10001",
		Cmd:        cmd,
		Env:        append([]string{"HOME=/taskrun/home", "TASKRUN_MODEL_SOCKET=/taskrun/.gateway/model.sock"}, env...),
		WorkingDir: "/taskrun",
		Labels:     map[string]string{"dev.taskrun.managed": "true", "dev.taskrun.test": testLabel},
	}, &container.HostConfig{
		Runtime:        runtime,
		NetworkMode:    "none",
		ReadonlyRootfs: true,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		Tmpfs:          map[string]string{"/tmp": "rw,nosuid,nodev,size=16m"},
		Mounts:         mounts,
	})
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

// assertNoFileContains fails if any regular file under dir holds secret.
func assertNoFileContains(t *testing.T, dir, secret string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		data, err := io.ReadAll(f)
		assert.NotContains(t, string(data), secret, path)
		return err
	}))
}

func TestAgentDoesDemoInContainer(t *testing.T) {
	cli := dockerClient(t)
	agentBin := buildStatic(t, "taskrun-agent")
	runDir := agentRunDir(t)
	require.NoError(t, os.CopyFS(filepath.Join(runDir, "home"), examples.DemoWorkspace()))
	for _, d := range []string{"artifacts", "global", "output"} {
		require.NoError(t, os.Mkdir(filepath.Join(runDir, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(runDir, "AGENTS.md"), []byte("# Run\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(runDir, "prompt.txt"), []byte(examples.DemoPrompt), 0o644))
	for _, d := range []string{"home", "artifacts", "global", "output"} {
		require.NoError(t, chownTree(filepath.Join(runDir, d), DefaultAgentUID))
	}
	g, err := Start(context.Background(), Config{
		SocketPath: filepath.Join(runDir, ".gateway", "model.sock"),
		Model:      config.ModelEntry{Provider: config.ProviderScripted, Name: DemoScriptName},
		Logger:     quietLogger,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })

	stdout, stderr := runContainer(t, cli, "runc", runDir, []string{agentBin}, []string{"/usr/local/bin/taskrun-agent"},
		[]string{"TASKRUN_RUN_ID=run1", "TASKRUN_SESSION_ID=sess1", "TASKRUN_PROMPT_FILE=/taskrun/prompt.txt", "TASKRUN_MODEL=" + g.ModelName()})
	require.Contains(t, stdout, "final answer written", "stdout: %s\nstderr: %s", stdout, stderr)
	assert.Contains(t, stdout, "[tool] list_dir")
	greet, err := os.ReadFile(filepath.Join(runDir, "home", "greet.go"))
	require.NoError(t, err)
	assert.NotContains(t, string(greet), "TODO")
	assert.FileExists(t, filepath.Join(runDir, "artifacts", "report.md"))
	assert.FileExists(t, filepath.Join(runDir, "output", "result.md"))
	assert.FileExists(t, filepath.Join(runDir, "global", "traces", "sess1", "rt_run1.jsonl"))
	_, _, lines := scriptTotals(t, examples.DemoScript)
	assert.Equal(t, lines, g.Usage().Requests)
}

// chownTree gives a directory tree to uid, as the executor does for a run.
func chownTree(dir string, uid int) error {
	return filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, uid)
	})
}

// An agent built on the official SDKs, configured by nothing but the base
// URLs taskrun-relay sets (no key), talks to every API through the relay in
// a hardened container, and the gateway meters exactly the script's usage.
func TestSDKAgentInContainerThroughRelay(t *testing.T) {
	cli := dockerClient(t)
	relayBin := buildStatic(t, "taskrun-relay")
	agentBin := buildStaticPkg(t, "github.com/taskrun/taskrun/gateway/internal/sdkagent")
	runDir := agentRunDir(t)
	script := filepath.Join(t.TempDir(), "s.jsonl")
	lines := strings.Repeat(`{"content":"Looking around. ","tool_calls":[{"id":"c1","name":"list_dir","arguments":{"path":"."}}],"usage":{"prompt_tokens":40,"completion_tokens":6,"cache_read_tokens":10}}`+"\n", 3)
	require.NoError(t, os.WriteFile(script, []byte(lines), 0o644))
	var trace lockedbuf.Buffer
	g, err := Start(context.Background(), Config{
		SocketPath: filepath.Join(runDir, ".gateway", "model.sock"),
		Model:      config.ModelEntry{Provider: config.ProviderScripted, Name: script},
		Trace:      &trace,
		Logger:     quietLogger,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })

	stdout, stderr := runContainer(t, cli, "runc", runDir, []string{relayBin, agentBin},
		[]string{"/usr/local/bin/taskrun-relay", "--", "/usr/local/bin/sdkagent"}, nil)
	var apis []string
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var res struct {
			API          string   `json:"api"`
			Text         string   `json:"text"`
			ToolCalls    []string `json:"tool_calls"`
			InputTokens  int      `json:"input_tokens"`
			OutputTokens int      `json:"output_tokens"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &res), "stdout: %s\nstderr: %s", stdout, stderr)
		apis = append(apis, res.API)
		assert.Equal(t, "Looking around. ", res.Text, res.API)
		assert.Equal(t, []string{`list_dir {"path":"."}`}, res.ToolCalls, res.API)
		assert.Equal(t, 40, res.InputTokens, res.API)
		assert.Equal(t, 6, res.OutputTokens, res.API)
	}
	assert.Equal(t, []string{"chat.completions", "responses", "messages"}, apis, "stderr: %s", stderr)
	require.NoError(t, g.Close())
	assert.Equal(t, Usage{PromptTokens: 120, CompletionTokens: 18, Requests: 3, CacheReadTokens: 30}, g.Usage())
	assert.Equal(t, 3, strings.Count(trace.String(), "\n"))
}

// docExamples are the offline examples of docs/agents.md: the commands
// after "--" of its "taskrun run --image taskrun/testbox:local --model
// scripted" blocks, line continuations joined.
func docExamples(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("../docs/agents.md")
	require.NoError(t, err)
	var cmds []string
	for i, block := range strings.Split(string(doc), "```") {
		if i%2 == 0 || !strings.Contains(block, "--image taskrun/testbox:local --model scripted") {
			continue
		}
		joined := strings.ReplaceAll(block, "\\\n", " ")
		_, cmd, ok := strings.Cut(joined, " -- ")
		require.True(t, ok, block)
		cmds = append(cmds, strings.TrimSpace(cmd))
	}
	return cmds
}

// The offline examples of docs/agents.md, run as written (the relay at
// its in-sandbox path), get answers from the scripted model.
func TestAgentsDocExamplesWork(t *testing.T) {
	cli := dockerClient(t)
	relayBin := buildStatic(t, "taskrun-relay")
	cmds := docExamples(t)
	require.Len(t, cmds, 2, "one OpenAI and one Anthropic example")
	for i, want := range []string{`"object":"response"`, `"type":"message"`} {
		runDir := agentRunDir(t)
		g, err := Start(context.Background(), Config{
			SocketPath: filepath.Join(runDir, ".gateway", "model.sock"),
			Model:      config.ModelEntry{Provider: config.ProviderScripted, Name: DemoScriptName},
			Logger:     quietLogger,
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = g.Close() })
		stdout, stderr := runContainer(t, cli, "runc", runDir, nil, []string{"/bin/sh", "-c", cmds[i]}, nil,
			map[string]string{"/.taskrun/bin/taskrun-relay": relayBin})
		assert.Contains(t, stdout, want, "%s\nstderr: %s", cmds[i], stderr)
		require.NoError(t, g.Close())
		assert.Equal(t, 1, g.Usage().Requests, cmds[i])
	}
}
