package worker_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/warmpool"
)

// testImage is the image `make images` builds for tests (busybox).
const testImage = "taskrun/testbox:local"

// A worker with a warm pool (real engine) keeps a container of its default
// key parked, a leased run takes it (the run's container is the parked
// one, and the pool counts a claim and no miss), the parked containers'
// memory is held back from the capacity it reports, and once the worker
// stopped no container of its instance is left.
func TestWorkerRunsTakeWarmContainers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real containers")
	}
	f := newFixture(t)
	ctx := context.Background()
	inst := instance.NewID()
	backend, err := docker.New(ctx, docker.WithInstance(inst))
	require.NoError(t, err)
	t.Cleanup(func() { _ = backend.Close() })
	uids, err := uidpool.New(filepath.Join(t.TempDir(), "uids"), uidpool.Range{First: 293000, Last: 293099})
	require.NoError(t, err)
	mine := map[string]string{sandbox.LabelInstance: inst}
	t.Cleanup(func() { _ = runtest.RemoveContainers(context.Background(), mine) })

	f.host.Backend = backend
	f.host.Executor = instance.Info{ID: inst}
	f.host.Defaults.Image = testImage
	f.host.Pull = sandbox.PullNever
	f.host.HelpersDir = testbin.Dir(t)
	f.host.UIDs = uids
	f.host.Defaults.DiskLimitBytes = 0 // the default loop-mounted cap, as in production
	f.host.Warm = &executor.Warm{PerKey: 1, MaxSlots: 1}
	f.cfg.Images = nil
	f.cfg.Slots = 1
	f.cfg.MemoryBytes = 8 << 30
	_, stop := f.start(t)
	pool := f.cfg.Host.WarmPool()

	// The worker warms its default key before any run is leased.
	var parked []string
	require.Eventually(t, func() bool {
		parked, err = runtest.ListContainers(ctx, mine)
		return err == nil && len(parked) == 1 && pool.Stats().Ready == 1
	}, 2*time.Minute, 50*time.Millisecond, "no warm container parked: %+v", pool.Stats())
	assert.InDelta(t, 1, testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_warm_ready", "")), 0)

	a := assignment("warm1", "")
	a.Command = []string{"sh", "-c", "echo hello from $TASKRUN_RUN_ID"}
	f.cp.Enqueue(a)
	info := f.final(t, "warm1")
	require.Equal(t, model.StatusSucceeded, info.Status, info.Reason)
	data, ended, _ := f.cp.Stream("warm1")
	assert.True(t, ended)
	assert.Equal(t, "hello from warm1\n", string(data))
	var ran string
	for _, p := range f.cp.Patches("warm1") {
		if p.Container != nil && p.Container.ID != "" {
			ran = p.Container.ID
		}
	}
	assert.Equal(t, parked[0], ran, "the run ran in the parked container")
	st := pool.Stats()
	assert.Equal(t, 1, st.Claims)
	assert.Zero(t, st.Misses)
	assert.InDelta(t, 1, testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_warm_claims_total", "")), 0)
	assert.Zero(t, testutil.ToFloat64(counter(t, f.reg, "taskrun_worker_warm_misses_total", "")))

	// A parked container holds a run's memory limit back from the capacity
	// the worker reports.
	mem := f.cfg.Host.Defaults().Policy.MemoryBytes
	require.Eventually(t, func() bool { return pool.Stats().Ready == 1 }, 2*time.Minute, 50*time.Millisecond, "the pool refilled")
	before := len(f.cp.LeaseRequests())
	require.Eventually(t, func() bool { return len(f.cp.LeaseRequests()) > before }, 30*time.Second, 20*time.Millisecond)
	reqs := f.cp.LeaseRequests()
	assert.Equal(t, f.cfg.MemoryBytes-mem, reqs[len(reqs)-1].Capacity.FreeMemoryBytes)

	require.NoError(t, stop())
	left, err := runtest.ListContainers(ctx, mine)
	require.NoError(t, err)
	assert.Empty(t, left, "the worker removed its parked containers when it stopped")
	_, err = pool.Claim(ctx, warmpool.Template{})
	assert.ErrorIs(t, err, warmpool.ErrClosed, "the worker closed its pool")
}
