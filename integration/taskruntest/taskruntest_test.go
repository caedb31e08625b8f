package taskruntest_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/testcontainers/testcontainers-go"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/integration/taskruntest"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
)

// Labels testcontainers-go v0.45.0 puts on its resources and Ryuk filters on.
const (
	labelTestcontainers = "org.testcontainers"
	labelSessionID      = "org.testcontainers.sessionId"
	labelLang           = "org.testcontainers.lang"
	labelReap           = "org.testcontainers.reap"
)

func TestRunSucceedsWithWorkspaceAndArtifact(t *testing.T) {
	ctx := context.Background()
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "in.txt"), []byte("input file\n"), 0o644))

	res, err := taskruntest.Run(ctx, t, taskruntest.Options{
		Image:     testboxImage,
		Cmd:       []string{"sh", "-c", `cat "$HOME/in.txt"; id -u; cat "$TASKRUN_PROMPT_FILE" > /taskrun/artifacts/prompt.txt`},
		Workspace: ws,
		Prompt:    "the prompt",
	})
	require.NoError(t, err)

	assert.Equal(t, model.StatusSucceeded, res.Status)
	assert.Equal(t, 0, res.ExitCode)
	assert.Regexp(t, `^input file\n\d+\n$`, string(res.Stream), "the workspace was copied in")
	assert.True(t, res.StreamEnded)
	assert.Equal(t, model.StatusRunning, res.Patches[0].Status)
	assert.Equal(t, model.StatusSucceeded, res.Final().Status)
	art, err := res.Artifact(ctx, "prompt.txt")
	require.NoError(t, err)
	assert.Equal(t, "the prompt", string(art))
	log, err := res.RunFile(ctx, taskrun.OutputLogName)
	require.NoError(t, err)
	assert.Equal(t, res.Stream, log)
}

func TestRunFailureIsAResultAndAnError(t *testing.T) {
	res, err := taskruntest.Run(context.Background(), t, taskruntest.Options{
		Image: testboxImage,
		Cmd:   []string{"sh", "-c", "echo x; exit 7"},
	})
	require.ErrorIs(t, err, taskrun.ErrRunFailed)
	require.NotNil(t, res)
	assert.Equal(t, model.StatusFailed, res.Status)
	assert.Equal(t, 7, res.ExitCode)
	assert.Equal(t, "x\n", string(res.Stream))
	require.NotNil(t, res.Final().Error)
	assert.Equal(t, "agent exited with code 7", *res.Final().Error)
}

func TestRunPassesEnvToTheAgent(t *testing.T) {
	res, err := taskruntest.Run(context.Background(), t, taskruntest.Options{
		Image: testboxImage,
		Cmd:   []string{"sh", "-c", `echo "$FEATURE_FLAG"`},
		Env:   []string{"FEATURE_FLAG=on"},
	})
	require.NoError(t, err)
	assert.Equal(t, "on\n", string(res.Stream))

	_, err = taskruntest.Run(context.Background(), t, taskruntest.Options{
		Image: testboxImage,
		Cmd:   []string{"true"},
		Env:   []string{"TASKRUN_SESSION_ID=other"},
	})
	require.ErrorIs(t, err, taskrun.ErrInvalidInput, "a name taskrun sets is refused")
}

func TestRunRefusesMissingImage(t *testing.T) {
	_, err := taskruntest.Run(context.Background(), t, taskruntest.Options{})
	require.ErrorIs(t, err, taskruntest.ErrBadOptions)
}

func TestResumeSeesEarlierRunsFiles(t *testing.T) {
	ctx := context.Background()
	env, err := taskruntest.NewEnv(ctx, t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Close(context.Background())) })

	first, err := env.Run(ctx, taskruntest.Options{Image: testboxImage, Cmd: []string{"sh", "-c", `echo "$TASKRUN_RUN_ID" >> "$HOME/log"`}})
	require.NoError(t, err)
	second, err := env.Run(ctx, taskruntest.Options{
		Image: testboxImage, Cmd: []string{"sh", "-c", `echo "$TASKRUN_RUN_ID" >> "$HOME/log"; cat "$HOME/log"`},
		ResumeFrom: first.RunID,
	})
	require.NoError(t, err)
	assert.Equal(t, first.RunID+"\n"+second.RunID+"\n", string(second.Stream))
}

// The run container carries testcontainers' session labels while it is live,
// so Ryuk would reap it; and nothing is left once the run is over.
func TestLiveContainerCarriesSessionLabels(t *testing.T) {
	ctx := context.Background()
	env, err := taskruntest.NewEnv(ctx, t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Close(context.Background())) })
	cli := dockerClient(t)

	const runID = "live-labels"
	release := filepath.Join(env.RunDir(taskruntest.DefaultTaskID, runID), "home", "release")
	ready, stdout := waitForLine()
	done := make(chan *taskruntest.Result, 1)
	go func() {
		res, err := env.Run(ctx, taskruntest.Options{
			Image:  testboxImage,
			RunID:  runID,
			Cmd:    []string{"sh", "-c", "echo ready; while [ ! -e $HOME/release ]; do sleep 0.1; done"},
			Labels: map[string]string{"example.com/suite": "labels"},
			Stdout: stdout,
		})
		assert.NoError(t, err)
		done <- res
	}()
	select {
	case <-ready:
	case <-time.After(testdeadline.Scale(time.Minute)): // seconds on an idle machine
		t.Fatal("the run never printed ready")
	}

	live := envContainers(t, cli, env)
	require.Len(t, live, 1)
	labels := live[0].Labels
	assert.Equal(t, "true", labels[labelTestcontainers])
	assert.Equal(t, "go", labels[labelLang])
	assert.Equal(t, testcontainers.SessionID(), labels[labelSessionID])
	for k, v := range testcontainers.GenericLabels() {
		assert.Equal(t, v, labels[k], "Ryuk filters on every generic label; %s differs", k)
	}
	_, reap := labels[labelReap]
	assert.Equal(t, !ryukDisabled(), reap, "org.testcontainers.reap is set exactly when Ryuk is enabled")
	assert.Equal(t, "labels", labels["example.com/suite"])
	assert.Equal(t, "true", labels[sandbox.LabelManaged])
	assert.Equal(t, runID, labels[sandbox.LabelRun])

	require.NoError(t, os.WriteFile(release, nil, 0o644))
	res := <-done
	require.NotNil(t, res)
	assert.Equal(t, model.StatusSucceeded, res.Status)
	assert.Empty(t, envContainers(t, cli, env), "the run's container is removed")
}

// With Ryuk enabled (in a child process, since testcontainers reads its
// configuration once), the live container also carries the reap label.
func TestLiveContainerCarriesReapLabelWhenRyukIsEnabled(t *testing.T) {
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "false" {
		t.Skip("already the Ryuk-enabled child")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLiveContainerCarriesSessionLabels$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "TESTCONTAINERS_RYUK_DISABLED=false", testboxEnv+"="+testboxImage)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child with Ryuk enabled:\n%s", out)
	assert.Contains(t, string(out), "--- PASS: TestLiveContainerCarriesSessionLabels")
}

// ryukDisabled is testcontainers' reading of TESTCONTAINERS_RYUK_DISABLED.
func ryukDisabled() bool {
	v, err := strconv.ParseBool(os.Getenv("TESTCONTAINERS_RYUK_DISABLED"))
	return err == nil && v
}

// waitForLine returns a writer and a channel closed once a line was written.
func waitForLine() (<-chan struct{}, io.Writer) {
	pr, pw := io.Pipe()
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		if sc.Scan() {
			close(ready)
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	return ready, pw
}

func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

// envContainers lists the containers carrying env's label.
func envContainers(t *testing.T, cli *client.Client, env *taskruntest.Env) []container.Summary {
	t.Helper()
	list, err := cli.ContainerList(context.Background(), container.ListOptions{
		All:     true,
		Filters: filters.NewArgs(filters.Arg("label", taskruntest.LabelEnv+"="+env.ID())),
	})
	require.NoError(t, err)
	return list
}
