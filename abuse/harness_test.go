package abuse_test

import (
	"context"
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
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/sandbox"
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

// harness is the end-to-end Env of one test plus an engine client for
// what the tests observe from the host (stats, cgroups, logs).
type harness struct {
	*runtest.Env
	cli *client.Client
}

func newHarness(t *testing.T) *harness { return newHarnessOn(t, false) }

// startPaths are the two ways a run gets its container: created for it
// (cold) or parked ahead of it by a warm pool (package warmpool). The
// security-relevant tests run on both: escapes (network, Docker socket,
// host secrets, /proc/sys), the kernel's attack surface, the disk cap and
// the records one run could forge for another.
var startPaths = []struct {
	name string
	warm bool
}{{"cold", false}, {"warm", true}}

// onPaths runs test on a cold harness and on a warm one.
func onPaths(t *testing.T, test func(t *testing.T, h *harness)) {
	t.Helper()
	for _, sp := range startPaths {
		t.Run(sp.name, func(t *testing.T) {
			t.Parallel()
			test(t, newHarnessOn(t, sp.warm))
		})
	}
}

// newHarnessOn is newHarness, with a warm pool when warm: execute then runs
// each run in a container parked ahead of it.
func newHarnessOn(t *testing.T, warm bool) *harness {
	t.Helper()
	env := runtest.New(t, runtest.Options{Tenant: "abuse" + runtest.RandomID(), Warm: warm})
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return &harness{Env: env, cli: cli}
}

// input is a run of the shell script in the test image, with the
// in-sandbox self-check and the default policy.
func (h *harness) input(t *testing.T, runID, script string) (taskrun.RunTaskInput, *controlplanetest.Recorder) {
	t.Helper()
	rec := &controlplanetest.Recorder{}
	in := h.Input(runID, testImage, "sh", "-c", script)
	in.Task.Prompt = "misbehave"
	in.Updater = rec
	in.Policy = sandbox.DefaultPolicy()
	in.HelpersDir = testbin.Dir(t)
	in.Timeout = runTimeout
	in.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	return in, rec
}

// execute runs in through taskrun.Execute: on a warm harness in a
// container parked ahead of it, failing unless the run took one.
func (h *harness) execute(in taskrun.RunTaskInput) (*taskrun.Outcome, error) {
	return h.Env.Execute(context.Background(), in)
}

// runFile reads a run's object back from the store.
func (h *harness) runFile(t *testing.T, runID, name string) string {
	t.Helper()
	data, err := h.RunFile(context.Background(), runID, name)
	require.NoError(t, err, "run object %s", name)
	return string(data)
}

// storedKeys lists every object stored for the tenant.
func (h *harness) storedKeys(t *testing.T) []string {
	t.Helper()
	keys, err := h.Keys(context.Background())
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
		Filters: filters.NewArgs(filters.Arg("label", sandbox.LabelTenant+"="+h.Tenant)),
	})
	require.NoError(t, err)
	return list
}

// assertNoContainers fails if any container of the tenant is left.
func (h *harness) assertNoContainers(t *testing.T) {
	t.Helper()
	assert.Empty(t, h.containers(t), "containers left behind for tenant %s", h.Tenant)
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
			filters.Arg("label", sandbox.LabelTenant+"="+h.Tenant),
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
	if !h.hasRuntime(t, runtime) {
		t.Skipf("runtime %s is not registered with the engine", runtime)
	}
}

// hasRuntime reports whether the engine has the runtime ("" is the default).
func (h *harness) hasRuntime(t *testing.T, runtime string) bool {
	t.Helper()
	if runtime == "" {
		return true
	}
	info, err := h.cli.Info(context.Background())
	require.NoError(t, err)
	_, ok := info.Runtimes[runtime]
	return ok
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
