package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	sandboxdocker "github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/uidpool"
)

const testImage = "taskrun/testbox:local"

func TestParseRunFlagsDefaults(t *testing.T) {
	o, err := parseRunFlags(nil)
	require.NoError(t, err)
	assert.Equal(t, taskrun.DefaultImage, o.image)
	assert.Equal(t, "file://./.taskrun/store", o.store)
	assert.Equal(t, "./.taskrun/runtime", o.root)
	assert.Equal(t, sandbox.DefaultPolicy(), o.policy)
	assert.Equal(t, taskrun.DefaultTimeout, o.timeout)
	assert.Empty(t, o.command)
	assert.Regexp(t, `^r\d{8}T\d{6}-[a-z0-9]{8}$`, o.runID)
	assert.True(t, o.model.IsZero())
}

func TestParseRunFlagsContract(t *testing.T) {
	o, err := parseRunFlags([]string{
		"--workspace", "ws", "--prompt", "p", "--image", "img", "--store", "mem://", "--root", "r",
		"--session", "s1", "--resume-from", "prev", "--timeout", "90s", "--memory", "512m", "--cpus", "0.5",
		"--pids", "64", "--runtime", "runsc", "--json", "--", "sh", "-c", "echo hi",
	})
	require.NoError(t, err)
	assert.Equal(t, "ws", o.workspace)
	assert.Equal(t, "p", o.prompt)
	assert.Equal(t, "img", o.image)
	assert.Equal(t, "mem://", o.store)
	assert.Equal(t, "r", o.root)
	assert.Equal(t, "s1", o.session)
	assert.Equal(t, "prev", o.resumeFrom)
	assert.Equal(t, 90*time.Second, o.timeout)
	assert.EqualValues(t, 512<<20, o.policy.MemoryBytes)
	assert.EqualValues(t, 500_000_000, o.policy.NanoCPUs)
	assert.EqualValues(t, 64, o.policy.PidsLimit)
	assert.Equal(t, "runsc", o.policy.Runtime)
	assert.True(t, o.jsonOut)
	assert.Equal(t, []string{"sh", "-c", "echo hi"}, o.command)
}

func TestParseRunFlagsRejectsBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"--memory", "lots"},
		{"--memory", "0"},
		{"--cpus", "0"},
		{"--timeout", "-1s"},
		{"--disk", "none"},
		{"--token", "t"},
		{"--model", "gpt"},
		{"--model", "openai:gpt-4o"},
		{"--model-base-url", "http://x"},
		{"--no-such-flag"},
		{"--pull", "sometimes"},
	} {
		_, err := parseRunFlags(args)
		assert.Error(t, err, "%q", args)
	}
}

func TestParseRunFlagsSessionExcludes(t *testing.T) {
	o, err := parseRunFlags([]string{"--session-exclude", "build", "--session-exclude", "*.log"})
	require.NoError(t, err)
	assert.Equal(t, []string{"build", "*.log"}, o.excludes)
}

func TestParseRunFlagsModels(t *testing.T) {
	o, err := parseRunFlags([]string{"--model", "scripted"})
	require.NoError(t, err)
	assert.Equal(t, config.ModelEntry{Provider: config.ProviderScripted, Name: gateway.DemoScriptName}, o.model)

	o, err = parseRunFlags([]string{"--model", "scripted:/tmp/s.jsonl"})
	require.NoError(t, err)
	assert.Equal(t, "/tmp/s.jsonl", o.model.Name)

	o, err = parseRunFlags([]string{"--model", "openai:gpt-4o", "--model-base-url", "https://api.example/v1", "--model-api-key-env", "KEY"})
	require.NoError(t, err)
	assert.Equal(t, config.ModelEntry{Provider: config.ProviderOpenAI, Name: "gpt-4o", BaseURL: "https://api.example/v1", APIKeyEnv: "KEY"}, o.model)
}

func TestParseRunFlagsAnthropicModel(t *testing.T) {
	o, err := parseRunFlags([]string{"--model", "anthropic:claude-test", "--model-api-key-env", "KEY"})
	require.NoError(t, err)
	assert.Equal(t, config.ModelEntry{Provider: config.ProviderAnthropic, Name: "claude-test", APIKeyEnv: "KEY"}, o.model)
	_, err = parseRunFlags([]string{"--model", "anthropic:claude-test"})
	assert.ErrorContains(t, err, "--model-api-key-env")
	_, err = parseRunFlags([]string{"--model", "anthropic:"})
	assert.ErrorContains(t, err, "needs a model name")
}

func TestParseRunFlagsEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), "run.env")
	require.NoError(t, os.WriteFile(file, []byte("# settings\nLEVEL=debug\nGREETING=from file\n"), 0o644))
	t.Setenv("TASKRUN_TEST_FROM_HOST", "host value")
	_, err := parseRunFlags([]string{"--env-file", file, "--env", "TASKRUN_TEST_FROM_HOST"})
	require.ErrorIs(t, err, config.ErrBadEnv, "a bare TASKRUN_* name is still reserved")
	o, err := parseRunFlags([]string{"--env-file", file, "--env", "GREETING=from flag", "--env", "EMPTY="})
	require.NoError(t, err)
	assert.Equal(t, []string{"LEVEL=debug", "GREETING=from flag", "EMPTY="}, o.env, "--env overrides the file, as in docker run")

	for _, args := range [][]string{{"--env", "HOME=/root"}, {"--env", "HTTP_PROXY=http://x:1"}, {"--env", "TASKRUN_RUN_ID=x"}} {
		_, err := parseRunFlags(args)
		require.ErrorIs(t, err, config.ErrBadEnv, args)
		assert.ErrorContains(t, err, "is set by taskrun", args)
	}
	_, err = parseRunFlags([]string{"--env-file", filepath.Join(t.TempDir(), "missing.env")})
	assert.ErrorContains(t, err, "--env-file")
}

func TestRunEnvReachesTheAgent(t *testing.T) {
	stdout, stderr, code := cli(t, "--image", testImage, "--env", "GREETING=hello world", "--", "sh", "-c", `echo "[$GREETING]"`)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "[hello world]\n", stdout)
	_, stderr, code = cli(t, "--image", testImage, "--env", "HOME=/root", "--", "true")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "HOME is set by taskrun")
}

// --entrypoint replaces the image's entrypoint, as docker run's does: what
// follows -- are its arguments.
func TestRunEntrypoint(t *testing.T) {
	stdout, stderr, code := cli(t, "--image", testImage, "--entrypoint", "/bin/echo", "--", "hello", "world")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "hello world\n", stdout)
}

func TestExitCodeFollowsDockerRun(t *testing.T) {
	assert.Equal(t, 0, exitCode(&taskrun.Outcome{Status: model.StatusSucceeded}, nil))
	assert.Equal(t, 7, exitCode(&taskrun.Outcome{Status: model.StatusFailed, Exit: sandbox.Result{ExitCode: 7}}, taskrun.ErrRunFailed))
	assert.Equal(t, 124, exitCode(&taskrun.Outcome{Status: model.StatusFailed, Exit: sandbox.Result{ExitCode: 143, TimedOut: true}}, taskrun.ErrRunFailed))
	assert.Equal(t, 125, exitCode(nil, errCannotRun))
	assert.Equal(t, 130, exitCode(&taskrun.Outcome{Status: model.StatusCancelled}, taskrun.ErrRunFailed))
	assert.Equal(t, 1, exitCode(&taskrun.Outcome{Status: model.StatusFailed}, taskrun.ErrRunFailed))
	assert.Equal(t, 1, exitCode(&taskrun.Outcome{Status: model.StatusFailed, Exit: sandbox.Result{ExitCode: -1}}, taskrun.ErrRunFailed), "an unknown exit code is a failure, not 255")
}

// cli runs `taskrun run` in-process against the real engine, with its own
// root and store, and returns stdout, stderr and the exit status.
func cli(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real containers")
	}
	base := []string{"run", "--root", t.TempDir(), "--store", "file://" + t.TempDir(), "--helpers-dir", "", "--gc=false", "--user", tenant(t)}
	var stdout, stderr lockedbuf.Buffer
	code := dispatch(context.Background(), append(base, args...), &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

var tenants sync.Map

// tenant is a per-test user ID, so containers can be found by label.
func tenant(t *testing.T) string {
	v, _ := tenants.LoadOrStore(t.Name(), "t"+strings.ToLower(rand.Text()[:10]))
	return v.(string)
}

func TestRunStreamsStdoutVerbatimAndExitsWithTheContainersCode(t *testing.T) {
	stdout, stderr, code := cli(t, "--image", testImage, "--", "sh", "-c", "echo out; echo err >&2; printf tail; exit 7")
	assert.Equal(t, 7, code, stderr)
	assert.Equal(t, "out\ntail", stdout)
	assert.Contains(t, stderr, "err\n")
}

func TestRunJSONResult(t *testing.T) {
	// The run lasts a second, so its usage is sampled while it lives.
	stdout, stderr, code := cli(t, "--image", testImage, "--json", "--", "sh", "-c", "echo to-stderr; sleep 1")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "to-stderr\n", "with --json the run's stdout goes to stderr")
	var res struct {
		RunID     string               `json:"run_id"`
		Status    model.RunStatus      `json:"status"`
		ExitCode  int                  `json:"exit_code"`
		OOMKilled bool                 `json:"oom_killed"`
		TimedOut  bool                 `json:"timed_out"`
		Error     string               `json:"error"`
		Result    map[string]any       `json:"result"`
		Stored    []persist.ObjectInfo `json:"stored"`
		Usage     *sandbox.Usage       `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	require.NotNil(t, res.Usage, "the Docker backend samples the run's usage: %s", stdout)
	assert.Positive(t, res.Usage.Samples)
	assert.Positive(t, res.Usage.PeakMemoryBytes)
	assert.Positive(t, res.Usage.PeakPids)
	assert.NotEmpty(t, res.RunID)
	assert.Equal(t, model.StatusSucceeded, res.Status)
	for _, key := range []string{"end_time", "output_str", "prompt_tokens", "completion_tokens", "trace_path"} {
		assert.Contains(t, res.Result, key)
	}
	assert.NotContains(t, res.Result, "run_artifacts_dir", "the run dir is removed once persisted, so --json does not name it")
	assert.Equal(t, "to-stderr\n", res.Result["output_str"])
	keys := map[string]bool{}
	for _, o := range res.Stored {
		keys[o.Key] = true
		assert.NotEmpty(t, o.SHA256)
	}
	ref := persist.RunRef{UserID: tenant(t), ConversationID: defaultConversation, TaskID: defaultTask, RunID: res.RunID}
	for _, name := range []string{taskrun.OutputLogName, taskrun.SessionStateName, taskrun.AuditRecordName} {
		key, err := persist.RunKey(ref, name)
		require.NoError(t, err)
		assert.True(t, keys[key], "stored lists %s: %v", key, keys)
	}
}

func TestRunTimeoutExits124(t *testing.T) {
	_, stderr, code := cli(t, "--image", testImage, "--timeout", "1s", "--", "sleep", "60")
	assert.Equal(t, exitTimeout, code, stderr)
	assert.Contains(t, stderr, ": FAILED (exit 124", "the summary's exit status is the process's")
}

func TestRunBadInputExits125WithTheFix(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		fix  string
	}{
		{"missing workspace", []string{"--workspace", "/no/such/dir"}, nil, "pass an existing directory"},
		{"id with slash", []string{"--task", "a/b"}, nil, "use 1-128 characters"},
		{"id with dots", []string{"--session", ".."}, nil, "use 1-128 characters"},
		{"missing image", []string{"--image", "taskrun/absent:local", "--pull", "never"}, nil, "taskrun images build"},
		{"image not allowed", []string{"--image", "taskrun/absent:local", "--allowed-images", "127.0.0.1:5000/team/*"}, nil, "--allowed-images"},
		{"no daemon", nil, map[string]string{"DOCKER_HOST": "unix:///nonexistent/docker.sock"}, "DOCKER_HOST"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, stderr, code := cli(t, tc.args...)
			assert.Equal(t, exitCannotRun, code, stderr)
			assert.Contains(t, stderr, tc.fix)
		})
	}
}

// `taskrun run --image IMG -- CMD` runs any command under the policy: the
// live container passes every audit rule and carries the policy's values.
func TestRunAppliesPolicyToLiveContainer(t *testing.T) {
	docker, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	defer docker.Close()
	user := tenant(t)

	// The container is looked for until it is seen or the run ended, however
	// long the machine takes to start it.
	var raw []byte
	found, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(found)
		for {
			list, err := docker.ContainerList(context.Background(), container.ListOptions{
				Filters: filters.NewArgs(filters.Arg("label", "dev.taskrun.tenant="+user)),
			})
			if err == nil && len(list) == 1 {
				_, raw, _ = docker.ContainerInspectWithRaw(context.Background(), list[0].ID, false)
				return
			}
			select {
			case <-ended:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	_, stderr, code := cli(t, "--image", testImage, "--memory", "256m", "--pids", "64", "--cpus", "0.5", "--", "sleep", "4")
	close(ended)
	<-found
	require.Equal(t, 0, code, stderr)
	require.NotEmpty(t, raw, "the run's container was never seen live")

	p, err := sandboxdocker.ParseInspect(raw)
	require.NoError(t, err)
	info, err := docker.Info(context.Background())
	require.NoError(t, err)
	rep := audit.Check(p, sandboxdocker.HostFactsFromInfo(info), audit.Options{})
	assert.False(t, rep.Failed(), "failed rules: %v", rep.FailedIDs())

	var insp container.InspectResponse
	require.NoError(t, json.Unmarshal(raw, &insp))
	hc := insp.HostConfig
	uid, gid, ok := strings.Cut(insp.Config.User, ":")
	require.True(t, ok, "user %q is uid:gid", insp.Config.User)
	assert.Equal(t, uid, gid)
	n, err := strconv.Atoi(uid)
	require.NoError(t, err)
	def := uidpool.DefaultRange()
	assert.True(t, n >= def.First && n <= def.Last, "uid %d is leased from the default --uid-range", n)
	assert.EqualValues(t, 256<<20, hc.Memory)
	assert.EqualValues(t, 256<<20, hc.MemorySwap)
	assert.EqualValues(t, 64, *hc.PidsLimit)
	assert.EqualValues(t, 500_000_000, hc.NanoCPUs)
	assert.Equal(t, []string{"ALL"}, []string(hc.CapDrop))
	assert.Empty(t, hc.CapAdd)
	assert.Contains(t, hc.SecurityOpt, "no-new-privileges")
	assert.True(t, hc.ReadonlyRootfs)
	assert.Equal(t, "none", string(hc.NetworkMode))
	assert.True(t, *hc.Init)
	assert.Equal(t, "private", string(hc.IpcMode))
	assert.Equal(t, "no", string(hc.RestartPolicy.Name))
	assert.Contains(t, hc.Tmpfs, "/tmp")
	assert.Equal(t, "json-file", hc.LogConfig.Type)
	require.Len(t, insp.Mounts, 1, "only the run's own directory is mounted")
	assert.Equal(t, "/taskrun", insp.Mounts[0].Destination)
	assert.Equal(t, insp.Config.Labels[sandbox.LabelRunDir], insp.Mounts[0].Source, "the label names the mounted run dir, so audit checks it exactly")
	assert.NotEmpty(t, hc.LogConfig.Config["max-size"])
}

// `taskrun run --session s --resume-from R` sees the files run R left in home.
func TestRunResumeFromSeesPreviousHome(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real containers")
	}
	root, store := t.TempDir(), "file://"+t.TempDir()
	run := func(args ...string) (string, string, int) {
		var stdout, stderr lockedbuf.Buffer
		base := []string{"run", "--root", root, "--store", store, "--helpers-dir", "", "--gc=false", "--user", tenant(t), "--image", testImage, "--session", "s"}
		code := dispatch(context.Background(), append(base, args...), &stdout, &stderr)
		return stdout.String(), stderr.String(), code
	}
	_, stderr, code := run("--run-id", "first", "--", "sh", "-c", "echo kept > $HOME/left-by-first")
	require.Equal(t, 0, code, stderr)
	stdout, stderr, code := run("--run-id", "second", "--resume-from", "first", "--", "cat", "/taskrun/home/left-by-first")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "kept\n", stdout)

	_, stderr, code = run("--run-id", "third", "--resume-from", "nosuchrun", "--", "true")
	assert.Equal(t, exitCannotRun, code)
	assert.Contains(t, stderr, "nosuchrun")
}

// After a store failure the run is kept on the host, and `taskrun persist`
// uploads it once the store works again.
func TestPersistRetriesAKeptRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real containers")
	}
	root, storeDir := t.TempDir(), t.TempDir()
	store := "file://" + storeDir
	// A file where the store needs its tenants directory breaks every upload.
	blocker := filepath.Join(storeDir, "tenants")
	require.NoError(t, os.WriteFile(blocker, nil, 0o644))

	common := []string{"--root", root, "--store", store, "--user", tenant(t), "--run-id", "kept1"}
	var stdout, stderr lockedbuf.Buffer
	code := dispatch(context.Background(), append(append([]string{"run"}, common...),
		"--helpers-dir", "", "--gc=false", "--image", testImage, "--", "sh", "-c", "echo precious"), &stdout, &stderr)
	require.Equal(t, exitFailure, code, stderr.String())
	assert.Equal(t, "precious\n", stdout.String())

	require.NoError(t, os.Remove(blocker))
	stderr = lockedbuf.Buffer{}
	code = dispatch(context.Background(), append([]string{"persist"}, common...), &stdout, &stderr)
	require.Equal(t, exitOK, code, stderr.String())
	assert.Contains(t, stderr.String(), "SUCCEEDED")

	st, err := persist.Open(context.Background(), store)
	require.NoError(t, err)
	defer st.Close()
	rc, err := st.OpenRunFile(context.Background(), persist.RunRef{UserID: tenant(t), ConversationID: defaultConversation, TaskID: "default", RunID: "kept1"}, taskrun.OutputLogName)
	require.NoError(t, err)
	defer rc.Close()
	data, err := io.ReadAll(rc)
	require.NoError(t, err)
	assert.Equal(t, "precious\n", string(data))
}

// On a terminal, the live copy of the run's output shows escape sequences as
// text; the stored output log keeps the agent's bytes exactly; --raw opts out.
func TestRunEscapesOutputForTheTerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real containers")
	}
	const script = `printf '\033]52;c;aGk=\007\033]0;title\007\033[2J'; printf 'run r: SUCCEEDED\n\033[8m'; printf '\033[31merr\n' >&2`
	const stored = "\x1b]52;c;aGk=\a\x1b]0;title\a\x1b[2Jrun r: SUCCEEDED\n\x1b[8m"
	for _, raw := range []bool{false, true} {
		t.Run(map[bool]string{false: "escaped", true: "raw"}[raw], func(t *testing.T) {
			storeURL := "file://" + t.TempDir()
			args := []string{"run", "--root", t.TempDir(), "--store", storeURL, "--helpers-dir", "", "--gc=false",
				"--user", tenant(t), "--run-id", "tty1", "--image", testImage}
			if raw {
				args = append(args, "--raw")
			}
			var stdout, stderr lockedbuf.Buffer
			a := newApp(&stdout, &stderr)
			a.isTerminal = func(io.Writer) bool { return true }
			code := a.run(context.Background(), append(args, "--", "sh", "-c", script))
			require.Equal(t, 0, code, stderr.String())

			if raw {
				assert.Equal(t, stored, stdout.String())
				assert.Contains(t, stderr.String(), "\x1b[31merr\n")
			} else {
				assert.Equal(t, "^[]52;c;aGk=^G^[]0;title^G^[[2Jrun r: SUCCEEDED\n^[[8m", stdout.String())
				assert.NotContains(t, stderr.String(), "\x1b")
				assert.Contains(t, stderr.String(), "^[[31merr\n")
			}

			st, err := persist.Open(context.Background(), storeURL)
			require.NoError(t, err)
			defer st.Close()
			rc, err := st.OpenRunFile(context.Background(), persist.RunRef{UserID: tenant(t), ConversationID: defaultConversation, TaskID: defaultTask, RunID: "tty1"}, taskrun.OutputLogName)
			require.NoError(t, err)
			defer rc.Close()
			data, err := io.ReadAll(rc)
			require.NoError(t, err)
			assert.Equal(t, stored, string(data), "the stored log is byte-exact")
		})
	}
}

func TestParseRunFlagsEgress(t *testing.T) {
	o, err := parseRunFlags(nil)
	require.NoError(t, err)
	assert.True(t, o.egress.IsZero(), "no flag, no proxy")

	policy := filepath.Join(t.TempDir(), "egress.json")
	require.NoError(t, os.WriteFile(policy, []byte(`{"rules": [{"host": "proxy.golang.org"}], "max_bytes": 1000}`), 0o644))
	o, err = parseRunFlags([]string{
		"--egress-policy", policy, "--allow", "api.github.com:443", "--allow", "*.npmjs.org",
		"--credential", `host=api.github.com,header=Authorization,value-env=GH_TOKEN,format="Bearer %s"`,
	})
	require.NoError(t, err)
	assert.Equal(t, egress.Policy{
		Rules:       []egress.Rule{{Host: "proxy.golang.org"}, {Host: "api.github.com", Port: 443}, {Host: "*.npmjs.org"}},
		Credentials: []egress.Credential{{Host: "api.github.com", Header: "Authorization", ValueEnv: "GH_TOKEN", Format: "Bearer %s"}},
		MaxBytes:    1000,
	}, o.egress)

	for _, args := range [][]string{
		{"--allow", "bad host"},
		{"--allow", "a.test:0"},
		{"--credential", "host=a.test,header=X,value-env=V"}, // no rule allows a.test
		{"--egress-policy", filepath.Join(t.TempDir(), "missing.json")},
	} {
		_, err := parseRunFlags(args)
		require.ErrorIs(t, err, egress.ErrBadPolicy, "%v", args)
	}
}
