package warmpool_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/probe"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/warmpool"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

const testImage = "taskrun/testbox:local"

// envCrashChild makes the test binary the crashing executor of
// TestCrashLeavesWhatGCRemoves.
const envCrashChild = "WARMPOOL_TEST_CRASH_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(envCrashChild); dir != "" {
		os.Exit(crashChild(dir))
	}
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// fixture is a pool on the real engine, for one test.
type fixture struct {
	env  *runtest.Env
	pool *warmpool.Pool
	tmpl warmpool.Template
	dir  string
}

// newFixture opens a pool of perKey slots per key whose backend labels
// containers with a fresh instance ID; tmpl is the key of a testbox run.
func newFixture(t *testing.T, perKey int, edit func(*warmpool.Template)) *fixture {
	return newFixtureUIDs(t, perKey, edit, nil)
}

// newFixtureUIDs is newFixture with a uid pool for the slots.
func newFixtureUIDs(t *testing.T, perKey int, edit func(*warmpool.Template), uids *uidpool.Pool) *fixture {
	t.Helper()
	return newFixtureConfig(t, edit, warmpool.Config{PerKey: perKey, MaxSlots: 4, UIDs: uids})
}

// newFixtureConfig is newFixture with the pool's cfg (its backend, Dir
// and Instance are the fixture's).
func newFixtureConfig(t *testing.T, edit func(*warmpool.Template), cfg warmpool.Config) *fixture {
	t.Helper()
	inst := instance.NewID()
	backend, err := docker.New(t.Context(), docker.WithInstance(inst))
	require.NoError(t, err)
	t.Cleanup(func() { backend.Close() })
	env := runtest.New(t, runtest.Options{})
	env.Backend = backend
	in := env.Input("tmpl", testImage, "true")
	in.Updater = &controlplanetest.Recorder{}
	in.HelpersDir = testbin.Dir(t)
	in.DiskLimitBytes = 16 << 20
	tmpl, err := taskrun.WarmTemplate(t.Context(), in)
	require.NoError(t, err)
	if edit != nil {
		edit(&tmpl)
	}
	dir := taskrun.PoolDir(env.Root)
	cfg.Backend, cfg.Dir, cfg.Instance = backend, dir, inst
	pool, err := warmpool.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, pool.Close(context.Background()))
		left, err := runtest.ListContainers(context.Background(), map[string]string{sandbox.LabelInstance: inst})
		assert.NoError(t, err)
		assert.Empty(t, left, "pool containers left after Close")
	})
	return &fixture{env: env, pool: pool, tmpl: tmpl, dir: filepath.Join(dir, inst)}
}

// waitReady waits for n ready slots.
func (f *fixture) waitReady(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	require.NoError(t, f.pool.WaitReady(ctx, f.tmpl, n))
}

// poolContainers lists the containers of the fixture's key.
func (f *fixture) poolContainers(t *testing.T) []string {
	t.Helper()
	ids, err := runtest.ListContainers(context.Background(), map[string]string{sandbox.LabelPool: f.tmpl.Key()})
	require.NoError(t, err)
	return ids
}

// runSlot releases s with a shell command under the self-check and waits
// for it; it returns stdout, stderr and the self-check's report.
func runSlot(t *testing.T, s *warmpool.Slot, script string, env ...string) (string, string, *probe.Report) {
	t.Helper()
	var stdout, stderr lockedbuf.Buffer
	nonce := "n" + runtest.RandomID()
	icpt := probe.NewInterceptor(&stderr, nonce)
	spec := sandbox.Spec{
		Wrapper: []string{helpers.ProbePath, "--nonce", nonce, "--"},
		Cmd:     []string{"sh", "-c", script},
		Env:     env,
		Timeout: time.Minute,
	}
	h, err := s.Release(t.Context(), spec, sandbox.Streams{Stdout: &stdout, Stderr: icpt})
	require.NoError(t, err)
	res := h.Wait(t.Context())
	require.NoError(t, res.Err)
	require.NoError(t, icpt.Flush())
	require.NoError(t, h.Close(context.Background()))
	rep, _ := icpt.Report()
	require.Equal(t, 0, res.ExitCode, "stderr: %s", stderr.String())
	return stdout.String(), stderr.String(), rep
}

// release gives back what a claiming run owns besides the container.
func release(t *testing.T, s *warmpool.Slot) {
	t.Helper()
	if u := s.Unmount(); u != nil {
		require.NoError(t, u())
	}
	require.NoError(t, os.RemoveAll(s.Dir()))
	if l := s.Lease(); l != nil {
		require.NoError(t, l.Release())
	}
}

func containerGone(t *testing.T, id string) bool {
	t.Helper()
	ids, err := runtest.ListContainers(context.Background(), map[string]string{sandbox.LabelManaged: "true"})
	require.NoError(t, err)
	for _, c := range ids {
		if c == id {
			return false
		}
	}
	return true
}

func TestOneContainerServesOneRunAndThePoolRefills(t *testing.T) {
	f := newFixture(t, 1, nil)
	f.waitReady(t, 1)

	first, err := f.pool.Claim(t.Context(), f.tmpl)
	require.NoError(t, err)
	_, err = f.pool.Claim(t.Context(), f.tmpl)
	require.ErrorIs(t, err, warmpool.ErrEmpty, "the only ready container went to the first claim")

	// The run's environment reaches the agent through the gate, over the
	// image's own, and the self-check reports with the run's nonce.
	out, _, rep := runSlot(t, first, `echo "id=$TASKRUN_RUN_ID path=$PATH"; ls -a /taskrun`, "TASKRUN_RUN_ID=r1")
	assert.Contains(t, out, "id=r1 path=/")
	assert.NotContains(t, out, ".gate", "the gate's socket is gone before the agent starts")
	require.NotNil(t, rep, "the self-check reported for the run")
	assert.True(t, containerGone(t, first.ContainerID()), "the first run's container is destroyed")
	firstDir := first.Dir()
	release(t, first)

	f.waitReady(t, 1)
	second, err := f.pool.Claim(t.Context(), f.tmpl)
	require.NoError(t, err)
	assert.NotEqual(t, first.ContainerID(), second.ContainerID(), "a second claim gets another container")
	assert.NotEqual(t, firstDir, second.Dir())
	out, _, _ = runSlot(t, second, `ls /taskrun/home | wc -l; echo "id=${TASKRUN_RUN_ID:-none}"`)
	assert.Equal(t, "0\nid=none\n", out, "nothing of the first run reaches the second")
	release(t, second)

	st := f.pool.Stats()
	assert.Equal(t, 2, st.Claims)
	assert.GreaterOrEqual(t, st.Filled, 2)
	assert.Equal(t, 1, st.Misses)
}

func TestSlotsHaveTheirOwnUIDs(t *testing.T) {
	uids, err := uidpool.New(t.TempDir(), uidpool.Range{First: 292000, Last: 292999})
	require.NoError(t, err)
	f := newFixtureUIDs(t, 2, func(tm *warmpool.Template) { tm.LeaseUIDs = true }, uids)
	f.waitReady(t, 2)
	a, err := f.pool.Claim(t.Context(), f.tmpl)
	require.NoError(t, err)
	b, err := f.pool.Claim(t.Context(), f.tmpl)
	require.NoError(t, err)
	require.NotNil(t, a.Lease())
	assert.NotEqual(t, a.Lease().UID, b.Lease().UID, "two live containers never share a host uid")
	outA, _, _ := runSlot(t, a, "id -u")
	assert.Equal(t, fmt.Sprintf("%d\n", a.Lease().UID), outA)
	require.NoError(t, b.Close(context.Background()))
	release(t, a)
	release(t, b)
}

func TestFailingAuditDestroysTheSlotAndIsCounted(t *testing.T) {
	// gVisor demanded of a runc container: rule TR:gvisor fails on the
	// live container, as it would for a cold run.
	f := newFixture(t, 1, func(tm *warmpool.Template) { tm.Audit.RequireGVisor = true })
	require.NoError(t, f.pool.Warm(f.tmpl))
	require.Eventually(t, func() bool { return f.pool.Stats().AuditFailures >= 1 }, 3*time.Minute, 50*time.Millisecond)
	assert.Empty(t, f.poolContainers(t), "a container that failed its audit is destroyed")
	_, err := f.pool.Claim(t.Context(), f.tmpl)
	assert.ErrorIs(t, err, warmpool.ErrEmpty, "a failed container is never offered")
	assert.Zero(t, f.pool.Stats().Filled)
}

func TestCloseRemovesParkedContainers(t *testing.T) {
	f := newFixture(t, 2, nil)
	f.waitReady(t, 2)
	require.Len(t, f.poolContainers(t), 2)
	require.NoError(t, f.pool.Close(t.Context()))
	assert.Empty(t, f.poolContainers(t))
	_, err := os.Stat(f.dir)
	assert.ErrorIs(t, err, os.ErrNotExist, "the pool's slot directories are removed")
	_, err = f.pool.Claim(t.Context(), f.tmpl)
	assert.ErrorIs(t, err, warmpool.ErrClosed)
}

func TestParkedContainerThatDiesIsReplaced(t *testing.T) {
	f := newFixture(t, 1, nil)
	f.waitReady(t, 1)
	ids := f.poolContainers(t)
	require.Len(t, ids, 1)
	require.NoError(t, runtest.RemoveContainers(t.Context(), map[string]string{sandbox.LabelPool: f.tmpl.Key()}))
	require.Eventually(t, func() bool { return f.pool.Stats().Died == 1 }, time.Minute, 20*time.Millisecond)
	f.waitReady(t, 1)
	now := f.poolContainers(t)
	require.Len(t, now, 1)
	assert.NotEqual(t, ids[0], now[0])
}

// crashChild is an executor that parks a container, says so and is killed.
func crashChild(root string) int {
	ctx := context.Background()
	inst, err := instance.Start(filepath.Join(root, taskrun.ExecutorsDirName))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	backend, err := docker.New(ctx, docker.WithInstance(inst.ID()))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	var tmpl warmpool.Template
	if err := json.Unmarshal([]byte(os.Getenv(envCrashChild+"_TEMPLATE")), &tmpl); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	pool, err := warmpool.New(warmpool.Config{Backend: backend, Dir: taskrun.PoolDir(root), Instance: inst.ID(), PerKey: 1})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := pool.WaitReady(cctx, tmpl, 1); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("ready", inst.ID())
	select {} // killed by the test
}

func TestCrashLeavesWhatGCRemoves(t *testing.T) {
	f := newFixture(t, 1, nil)
	root := f.env.Root
	data, err := json.Marshal(f.tmpl)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashChild+"="+root, envCrashChild+"_TEMPLATE="+string(data))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	id, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	require.True(t, ok, "child: %s", line)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	left, err := runtest.ListContainers(t.Context(), map[string]string{sandbox.LabelInstance: id})
	require.NoError(t, err)
	require.Len(t, left, 1, "the crashed executor's parked container is left behind")
	slots, err := os.ReadDir(filepath.Join(taskrun.PoolDir(root), id))
	require.NoError(t, err)
	require.NotEmpty(t, slots)

	// What `taskrun gc` does: reap the containers of gone executors, then
	// sweep their pools.
	executors := filepath.Join(root, taskrun.ExecutorsDirName)
	gone := func(x string) (bool, string) {
		g, why, err := instance.Gone(executors, instance.Info{ID: x})
		require.NoError(t, err)
		return g, why
	}
	goneProcess := func(x, process string) (bool, string) {
		g, why, err := instance.Gone(executors, instance.ParseProcess(x, process))
		require.NoError(t, err)
		return g, why
	}
	rep, err := f.env.Backend.Reap(t.Context(), docker.ReapOptions{ExecutorGone: goneProcess, Labels: map[string]string{sandbox.LabelInstance: id}})
	require.NoError(t, err)
	assert.Len(t, rep.Removed, 1)
	removed, err := warmpool.Sweep(taskrun.PoolDir(root), func(x string) bool { g, _ := gone(x); return g }, func(string) bool { return false })
	require.NoError(t, err)
	assert.Len(t, removed, 1)
	left, err = runtest.ListContainers(t.Context(), map[string]string{sandbox.LabelInstance: id})
	require.NoError(t, err)
	assert.Empty(t, left)
	_, err = os.Stat(filepath.Join(taskrun.PoolDir(root), id))
	assert.ErrorIs(t, err, os.ErrNotExist, "the slot's directory and disk cap are gone")
}

// A pool with a memory budget keeps what recent demand asks for, within
// the budget: one slot for a key only warmed, more once runs claim it, and
// never more than the budget holds.
func TestMemoryBudgetSizesTheKeyFromDemand(t *testing.T) {
	const mem = 256 << 20
	f := newFixtureConfig(t, func(tm *warmpool.Template) {
		tm.Policy.MemoryBytes = mem
		tm.Expect.MemoryLimit = &tm.Policy.MemoryBytes
	}, warmpool.Config{PerKey: 4, MaxSlots: 4, MemoryBudget: 2 * mem})
	settled := func(n int) {
		t.Helper()
		f.waitReady(t, n)
		time.Sleep(3 * time.Second) // the pool would go on filling
		assert.Len(t, f.poolContainers(t), n)
		assert.Equal(t, n, f.pool.Ready(f.tmpl))
	}
	// Warmed, never claimed: demand of one.
	require.NoError(t, f.pool.Warm(f.tmpl))
	settled(1)

	// Three claims: demand of three, of which the budget holds two.
	for range 3 {
		s, err := f.pool.Claim(t.Context(), f.tmpl)
		if errors.Is(err, warmpool.ErrEmpty) {
			continue
		}
		require.NoError(t, err)
		runSlot(t, s, "true")
		release(t, s)
	}
	settled(2)
	assert.Zero(t, f.pool.Stats().Shrunk)

	// A smaller budget: the ready slot over it is removed.
	require.NoError(t, f.pool.SetMemoryBudget(mem))
	require.Eventually(t, func() bool { return f.pool.Stats().Shrunk == 1 }, time.Minute, 20*time.Millisecond)
	settled(1)
}
