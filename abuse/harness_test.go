package abuse_test

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"os"
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
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// testImage is the local busybox image every hostile workload runs in.
const testImage = "taskrun/testbox:local"

// runTimeout bounds a run that is expected to end on its own.
const runTimeout = 2 * time.Minute

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// last is the final PATCH rec received.
func last(t *testing.T, rec *controlplanetest.Recorder) workerclient.PatchTaskRunRequest {
	t.Helper()
	p, ok := rec.Last()
	require.True(t, ok, "the run was never reported")
	return p
}

// countingSender is a StreamSender that counts the streamed bytes without
// keeping them, so a flood does not grow the test process.
type countingSender struct {
	mu      sync.Mutex
	bytes   int64
	total   int64
	ended   bool
	ordered bool
}

func newCountingSender() *countingSender { return &countingSender{ordered: true} }

// Send counts d and checks it continues the stream.
func (c *countingSender) Send(_ context.Context, _ string, d workerclient.Delta) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ordered = c.ordered && d.Offset == c.bytes
	c.bytes += int64(len(d.Data))
	return nil
}

// End records the total the stream reported.
func (c *countingSender) End(_ context.Context, _ string, total int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended, c.total = true, total
	return nil
}

// harness holds the real parts a run needs: Docker, a file:// store, a run
// root and a tenant of its own, whose containers it checks are gone.
type harness struct {
	backend *docker.Backend
	cli     *client.Client
	store   *persist.Store
	root    string
	tenant  string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real containers")
	}
	ctx := context.Background()
	backend, err := docker.New(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { backend.Close() })
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	store, err := persist.Open(ctx, "file://"+t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	h := &harness{
		backend: backend,
		cli:     cli,
		store:   store,
		root:    t.TempDir(),
		tenant:  "abuse" + strings.ToLower(rand.Text()[:10]),
	}
	// Registered last, so it runs first: before the client is closed.
	t.Cleanup(func() { h.assertNoContainers(t) })
	return h
}

// input is a run of the shell script in the test image, with the
// in-sandbox self-check and the default policy.
func (h *harness) input(t *testing.T, runID, script string) (taskrun.RunTaskInput, *controlplanetest.Recorder) {
	t.Helper()
	rec := &controlplanetest.Recorder{}
	return taskrun.RunTaskInput{
		Task:            &model.Task{ID: "task1", UserID: h.tenant, ConversationID: "conv1", Prompt: "misbehave"},
		Run:             &model.TaskRun{ID: runID, TaskID: "task1"},
		SessionID:       "s1",
		Paths:           taskrun.NewRuntimePathsFromRoot(h.root),
		Persist:         h.store,
		ArtifactStorage: h.store,
		Updater:         rec,
		Sandbox:         h.backend,
		Image:           testImage,
		Command:         []string{"sh", "-c", script},
		Policy:          sandbox.DefaultPolicy(),
		HelpersDir:      testbin.Dir(t),
		Timeout:         runTimeout,
		Logger:          slog.New(slog.NewTextHandler(t.Output(), nil)),
	}, rec
}

func (h *harness) ref(runID string) persist.RunRef {
	return persist.RunRef{UserID: h.tenant, ConversationID: "conv1", TaskID: "task1", RunID: runID}
}

// runFile reads a run's object back from the store.
func (h *harness) runFile(t *testing.T, runID, name string) string {
	t.Helper()
	rc, err := h.store.OpenRunFile(context.Background(), h.ref(runID), name)
	require.NoError(t, err, "run object %s", name)
	defer rc.Close()
	data, err := io.ReadAll(rc)
	require.NoError(t, err)
	return string(data)
}

// storedKeys lists every object stored for the tenant.
func (h *harness) storedKeys(t *testing.T) []string {
	t.Helper()
	prefix, err := persist.TenantPrefix(h.tenant)
	require.NoError(t, err)
	keys, err := h.store.List(context.Background(), prefix)
	require.NoError(t, err)
	return keys
}

// record reads a run's isolation record.
func (h *harness) record(t *testing.T, runID string) audit.Record {
	t.Helper()
	rec, err := audit.ParseRecord([]byte(h.runFile(t, runID, taskrun.AuditRecordName)))
	require.NoError(t, err)
	return rec
}

// containers lists the tenant's containers, running or not.
func (h *harness) containers(t *testing.T) []container.Summary {
	t.Helper()
	list, err := h.cli.ContainerList(context.Background(), container.ListOptions{
		All:     true,
		Filters: filters.NewArgs(filters.Arg("label", sandbox.LabelTenant+"="+h.tenant)),
	})
	require.NoError(t, err)
	return list
}

// assertNoContainers fails if any container of the tenant is left.
func (h *harness) assertNoContainers(t *testing.T) {
	t.Helper()
	assert.Empty(t, h.containers(t), "containers left behind for tenant %s", h.tenant)
}

// outcome is what Execute returned.
type outcome struct {
	out *taskrun.Outcome
	err error
}

// watch runs in through Execute and, once the run's container exists, calls
// sample with its ID every interval until Execute returns, which it returns.
func (h *harness) watch(t *testing.T, in taskrun.RunTaskInput, interval time.Duration, sample func(id string)) outcome {
	t.Helper()
	done := make(chan outcome, 1)
	go func() {
		out, err := taskrun.Execute(context.Background(), in)
		done <- outcome{out, err}
	}()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var id string
	for {
		select {
		case o := <-done:
			return o
		case <-tick.C:
		}
		if id == "" {
			id = h.runContainer(t, in.Run.ID)
		}
		if id != "" {
			sample(id)
		}
	}
}

// runContainer is the ID of the run's running container, or "".
func (h *harness) runContainer(t *testing.T, runID string) string {
	t.Helper()
	list, err := h.cli.ContainerList(context.Background(), container.ListOptions{
		Filters: filters.NewArgs(
			filters.Arg("label", sandbox.LabelTenant+"="+h.tenant),
			filters.Arg("label", sandbox.LabelRun+"="+runID),
		),
	})
	require.NoError(t, err)
	if len(list) == 0 {
		return ""
	}
	return list[0].ID
}

// runtimes are the OCI runtimes a case is repeated under: the engine
// default (runc) and gVisor.
var runtimes = []struct{ name, runtime string }{
	{"runc", ""},
	{"gvisor", sandbox.RuntimeGVisor},
}

// requireRuntime skips the test when the engine lacks the runtime.
func (h *harness) requireRuntime(t *testing.T, runtime string) {
	t.Helper()
	if runtime == "" {
		return
	}
	info, err := h.cli.Info(context.Background())
	require.NoError(t, err)
	if _, ok := info.Runtimes[runtime]; !ok {
		t.Skipf("runtime %s is not registered with the engine", runtime)
	}
}

// requireRoot skips a test that reads the engine's files on the host.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("reads container cgroup and log files on the host: needs root")
	}
}

// section returns the lines of out between "== name" and the next "== "
// line, so assertions look only at what one step of a script printed.
func section(out, name string) string {
	var b strings.Builder
	in := false
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "== ") {
			in = strings.TrimSpace(strings.TrimPrefix(line, "== ")) == name
			continue
		}
		if in {
			b.WriteString(line)
		}
	}
	return b.String()
}
