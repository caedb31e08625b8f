package faults

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
)

// testImage is the run image every case uses (`make images`).
const testImage = "taskrun/testbox:local"

// conversation and task place the runs of `taskrun run`: its defaults.
const (
	conversation = "cli"
	task         = "default"
)

func TestMain(m *testing.M) {
	code := m.Run()
	removeTaskrunBin()
	testbin.Cleanup()
	os.Exit(code)
}

var (
	taskrunBinOnce sync.Once
	taskrunBinPath string
	taskrunBinErr  error
	taskrunBinTemp string
)

// taskrunBin is the taskrun binary: the one `make build` put in
// TASKRUN_BIN_DIR (testbin.EnvBinDir), or one built once per test process.
func taskrunBin(t *testing.T) string {
	t.Helper()
	taskrunBinOnce.Do(func() {
		if d := os.Getenv(testbin.EnvBinDir); d != "" {
			taskrunBinPath = filepath.Join(d, "taskrun")
			if _, taskrunBinErr = os.Stat(taskrunBinPath); taskrunBinErr != nil {
				taskrunBinErr = fmt.Errorf("%s=%s has no taskrun: run make build, or unset it: %w", testbin.EnvBinDir, d, taskrunBinErr)
			}
			return
		}
		dir, err := os.MkdirTemp("", "taskrun-faults-bin-")
		if err != nil {
			taskrunBinErr = err
			return
		}
		taskrunBinTemp = dir
		taskrunBinPath = filepath.Join(dir, "taskrun")
		cmd := exec.Command("go", "build", "-o", taskrunBinPath, "./cmd/taskrun")
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			taskrunBinErr = fmt.Errorf("go build: %w: %s", err, out)
		}
	})
	require.NoError(t, taskrunBinErr)
	return taskrunBinPath
}

// removeTaskrunBin removes the binary taskrunBin built.
func removeTaskrunBin() {
	if taskrunBinTemp != "" {
		_ = os.RemoveAll(taskrunBinTemp)
	}
}

// moduleRoot is the repository root, found from this source file.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..")
}

// randomID is a short lowercase ID, valid as a tenant or a run ID.
func randomID() string { return strings.ToLower(rand.Text()[:10]) }

// env is one case's runs root, store and tenant, and the environment every
// taskrun process of the case gets (e.g. DOCKER_HOST of a private engine).
type env struct {
	root, store, user, helpers string
	vars                       []string
}

// newEnv is an env for a case that runs real containers: skipped in -short
// mode and when not root (disk caps are loop mounts).
func newEnv(t *testing.T, vars ...string) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real containers")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop-mounted disk caps")
	}
	return &env{root: t.TempDir(), store: "file://" + t.TempDir(), user: "t" + randomID(), helpers: testbin.Dir(t), vars: vars}
}

// command is taskrun with args, in the env's environment.
func (e *env) command(t *testing.T, args ...string) *exec.Cmd {
	cmd := exec.Command(taskrunBin(t), args...)
	cmd.Env = append(os.Environ(), e.vars...)
	return cmd
}

// runArgs are the arguments of `taskrun run` for runID, then the command.
func (e *env) runArgs(runID string, extra []string, cmd ...string) []string {
	args := []string{"run", "--root", e.root, "--store", e.store, "--user", e.user, "--run-id", runID,
		"--image", testImage, "--helpers-dir", e.helpers, "--gc=false"}
	args = append(args, extra...)
	return append(append(args, "--"), cmd...)
}

// runDir is the run's directory under the runs root.
func (e *env) runDir(runID string) string {
	return taskrun.NewRuntimePathsFromRoot(e.root).RuntimeTaskRunDir(e.user, conversation, task, runID)
}

// openStore opens the env's store; it is closed when t ends.
func (e *env) openStore(t *testing.T) *persist.Store {
	t.Helper()
	st, err := persist.Open(context.Background(), e.store)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// outputLog reads the output.log of a run of `taskrun run` from the store.
func (e *env) outputLog(t *testing.T, runID string) string {
	t.Helper()
	return e.outputLogOf(t, conversation, task, runID)
}

// outputLogOf reads the run's output.log from the store.
func (e *env) outputLogOf(t *testing.T, conversationID, taskID, runID string) string {
	t.Helper()
	rc, err := e.openStore(t).OpenRunFile(context.Background(), persist.RunRef{UserID: e.user, ConversationID: conversationID, TaskID: taskID, RunID: runID}, taskrun.OutputLogName)
	require.NoError(t, err, "the run's output.log is not in the store")
	defer rc.Close()
	data, err := io.ReadAll(rc)
	require.NoError(t, err)
	return string(data)
}

// indexed is the run index's records of the env's tenant.
func (e *env) indexed(t *testing.T) []runindex.Record {
	t.Helper()
	recs, err := runindex.List(context.Background(), e.openStore(t), runindex.Filter{UserID: e.user})
	require.NoError(t, err)
	return recs
}

// requireIndexedOnce checks the run index holds exactly one record of the
// tenant, with status want.
func (e *env) requireIndexedOnce(t *testing.T, want model.RunStatus) runindex.Record {
	t.Helper()
	recs := e.indexed(t)
	require.Len(t, recs, 1, "the run is indexed once")
	assert.Equal(t, want, recs[0].Status)
	return recs[0]
}

// requireNoLocalTrace checks the host holds nothing of the run outside the
// engine: no mount or loop device under the runs root, no run dir, no
// journal record.
func (e *env) requireNoLocalTrace(t *testing.T, runID string) {
	t.Helper()
	mounts, err := os.ReadFile("/proc/mounts")
	require.NoError(t, err)
	assert.NotContains(t, string(mounts), e.root+"/", "a mount under the runs root is left")
	loops, err := exec.Command("losetup", "-a").Output()
	require.NoError(t, err)
	assert.NotContains(t, string(loops), e.root+"/", "a loop device backed by a file under the runs root is left")
	assert.NoDirExists(t, e.runDir(runID))
	assert.NoDirExists(t, e.runDir(runID)+".executor")
	jd, err := taskrun.OpenRunJournal(e.root)
	require.NoError(t, err)
	_, err = jd.Load(runID)
	assert.ErrorIs(t, err, journal.ErrNotFound, "the run's journal record is left")
}

// requireNumberedLines checks out is "line 0\n" ... "line N-1\n" (the last
// line may be cut) and returns N.
func requireNumberedLines(t *testing.T, out string) int {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range lines {
		require.True(t, strings.HasPrefix(fmt.Sprintf("line %d", i), l) || l == fmt.Sprintf("line %d", i), "line %d is %q", i, l)
	}
	return len(lines)
}

// printer prints numbered lines every 20 ms; n of them, or forever when n
// is 0.
func printer(n int) []string {
	cond := "true"
	if n > 0 {
		cond = fmt.Sprintf("[ $i -lt %d ]", n)
	}
	return []string{"sh", "-c", fmt.Sprintf(`i=0; while %s; do echo "line $i"; i=$((i+1)); sleep 0.02; done`, cond)}
}
