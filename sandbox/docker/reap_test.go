package docker

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/sandbox"
)

// exitedOrphan plants a container that ran `true` an hour ago and waits for it to exit.
func exitedOrphan(t *testing.T, b *Backend, labels map[string]string) string {
	t.Helper()
	id, err := plantContainer(t.Context(), b, labels, "", time.Now().Add(-time.Hour), "true")
	require.NoError(t, err)
	waitC, errC := b.api.ContainerWait(t.Context(), id, container.WaitConditionNotRunning)
	select {
	case <-waitC:
	case err := <-errC:
		require.NoError(t, err)
	}
	return id
}

// removedIDs lists the container IDs in a report.
func removedIDs(rep ReapReport) []string {
	var ids []string
	for _, c := range rep.Removed {
		ids = append(ids, c.ID)
	}
	return ids
}

func TestReapRules(t *testing.T) {
	// The reaper's clock runs past the grace: the exited orphan's finish
	// has fallen out of it, without waiting. A long grace keeps the young
	// container young however slow the engine is.
	const grace = time.Minute
	later := func() time.Time { return time.Now().Add(grace + time.Second) }
	b, labels := newTestBackend(t, WithClock(later))
	ctx := t.Context()

	exited := exitedOrphan(t, b, labels)
	expired, err := plantOrphan(ctx, b, labels, "")
	require.NoError(t, err)
	young, err := plantContainer(ctx, b, labels, "", later(), "true")
	require.NoError(t, err)

	// A run of this backend that has exited but is not closed yet.
	mine, err := b.Start(ctx, sandbox.Spec{Image: testImage, Cmd: []string{"true"}, Labels: labels}, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.NoError(t, err)
	require.NoError(t, mine.Wait(ctx).Err)
	t.Cleanup(func() { _ = mine.Close(context.Background()) })

	// A running run of another executor, within its expiry.
	other, _ := newTestBackend(t)
	theirs, err := other.Start(ctx, sandbox.Spec{Image: testImage, Cmd: []string{"sleep", "1000"}, Labels: labels,
		Timeout: 10 * time.Minute, StopGrace: time.Second}, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = theirs.Close(context.Background()) })

	dry, err := b.Reap(ctx, ReapOptions{Labels: labels, Grace: grace, DryRun: true, All: true})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{exited, expired}, removedIDs(dry))
	assert.Equal(t, 3, dry.Spared)
	left, err := b.listLabelled(ctx, labels)
	require.NoError(t, err)
	assert.Len(t, left, 5, "a dry run removed something")

	rep, err := b.Reap(ctx, ReapOptions{Labels: labels, Grace: grace, All: true})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{exited, expired}, removedIDs(rep))
	left, err = b.listLabelled(ctx, labels)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{young, mine.ID(), theirs.ID()}, left)
}

// An exited container whose run belongs to another executor is spared until
// the grace period has passed since it finished, whatever its age.
func TestOrphanReasonSparesRecentlyFinished(t *testing.T) {
	b := &Backend{live: map[string]*handle{}}
	now := time.Now()
	old := now.Add(-time.Hour).UTC().Format(time.RFC3339)
	c := container.Summary{ID: "x", State: container.StateExited, Labels: map[string]string{sandbox.LabelCreated: old}}

	assert.Empty(t, b.orphanReason(c, now.Add(-time.Second), now, time.Minute), "finished a second ago")
	assert.NotEmpty(t, b.orphanReason(c, now.Add(-2*time.Minute), now, time.Minute), "finished two minutes ago")
	assert.NotEmpty(t, b.orphanReason(c, time.Time{}, now, time.Minute), "never inspected: created an hour ago")
}

// TestReapOnlyOwnAndGoneExecutors checks the multi-tenant rule: by default
// the reaper removes its own instance's orphans and the containers of
// executors proven gone (even running ones), and leaves live executors'
// containers and unlabelled ones alone; All widens it to the host.
func TestReapOnlyOwnAndGoneExecutors(t *testing.T) {
	const mine, live, gone = "xmine", "xlive", "xgone"
	b, labels := newTestBackend(t, WithInstance(mine))
	ctx := t.Context()
	with := func(inst string) map[string]string {
		l := maps.Clone(labels)
		if inst != "" {
			l[sandbox.LabelInstance] = inst
		}
		return l
	}
	old := time.Now().Add(-time.Hour)
	ownExited, err := plantContainer(ctx, b, with(mine), "", old, "true")
	require.NoError(t, err)
	liveExited, err := plantContainer(ctx, b, with(live), "", old, "true")
	require.NoError(t, err)
	unlabelled, err := plantContainer(ctx, b, with(""), "", old, "true")
	require.NoError(t, err)
	goneRunning, err := plantContainer(ctx, b, with(gone), "", time.Now(), "sleep", "1000")
	require.NoError(t, err)
	spared, err := plantContainer(ctx, b, with(gone), "", time.Now(), "sleep", "1000")
	require.NoError(t, err)
	for _, id := range []string{ownExited, liveExited, unlabelled} {
		waitC, errC := b.api.ContainerWait(ctx, id, container.WaitConditionNotRunning)
		select {
		case <-waitC:
		case err := <-errC:
			require.NoError(t, err)
		}
	}
	var asked []string
	goneFn := func(id, _ string) (bool, string) {
		asked = append(asked, id)
		return id == gone, "test says so"
	}
	// Finished containers count as finished an hour after they did.
	b.now = func() time.Time { return time.Now().Add(time.Hour) }

	rep, err := b.Reap(ctx, ReapOptions{Labels: labels, ExecutorGone: goneFn, Spare: []string{spared}})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{ownExited, goneRunning}, removedIDs(rep))
	assert.NotContains(t, asked, mine, "its own instance is never asked about")
	left, err := b.listLabelled(ctx, labels)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{liveExited, unlabelled, spared}, left)

	// A container created through this backend carries its instance ID, and
	// a caller's label cannot replace it.
	h, err := b.Start(ctx, sandbox.Spec{Image: testImage, Cmd: []string{"true"}, Labels: with(live)}, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.NoError(t, err)
	require.NoError(t, h.Wait(ctx).Err)
	info, _, err := b.api.ContainerInspectWithRaw(ctx, h.ID(), false)
	require.NoError(t, err)
	assert.Equal(t, mine, info.Config.Labels[sandbox.LabelInstance])
	require.NoError(t, h.Close(ctx))

	rep, err = b.Reap(ctx, ReapOptions{Labels: labels, All: true, Spare: []string{spared}})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{liveExited, unlabelled}, removedIDs(rep))
}

func TestReapNeverTouchesOtherLabels(t *testing.T) {
	b, labels := newTestBackend(t)
	_, otherLabels := newTestBackend(t)
	theirs := exitedOrphan(t, b, otherLabels)
	rep, err := b.Reap(t.Context(), ReapOptions{Labels: labels, Grace: time.Millisecond, All: true})
	require.NoError(t, err)
	assert.Empty(t, rep.Removed)
	left, err := b.listLabelled(t.Context(), otherLabels)
	require.NoError(t, err)
	assert.Equal(t, []string{theirs}, left)
}

func TestReapDanglingNetworks(t *testing.T) {
	b, labels := newTestBackend(t)
	name := "taskrun-reap-test-" + labels[labelTest]
	args := []string{"network", "create", "--internal", "--label", sandbox.LabelManaged + "=true"}
	for k, v := range labels {
		args = append(args, "--label", k+"="+v)
	}
	out, err := exec.CommandContext(t.Context(), "docker", append(args, name)...).CombinedOutput()
	require.NoError(t, err, string(out))
	t.Cleanup(func() { _ = exec.Command("docker", "network", "rm", name).Run() })

	rep, err := b.Reap(t.Context(), ReapOptions{Labels: labels, Grace: time.Millisecond, DryRun: true})
	require.NoError(t, err)
	require.Len(t, rep.Networks, 1)
	require.NoError(t, exec.CommandContext(t.Context(), "docker", "network", "inspect", name).Run(), "dry run removed the network")

	rep, err = b.Reap(t.Context(), ReapOptions{Labels: labels, Grace: time.Millisecond})
	require.NoError(t, err)
	require.Len(t, rep.Networks, 1)
	require.Error(t, exec.CommandContext(t.Context(), "docker", "network", "inspect", name).Run(), "network survived the reaper")
}

// TestReapContainerOfCleanlyExitedExecutor: an executor that exited
// cleanly removed its lock file, but its container survived (the engine
// failed its removal): the process record on the container proves the
// executor gone, and the container is reaped; a live executor's is not.
func TestReapContainerOfCleanlyExitedExecutor(t *testing.T) {
	b, labels := newTestBackend(t, WithInstance("xreaper"))
	ctx := t.Context()
	executors := t.TempDir()

	// A process that lived and exited: its record names a PID gone now.
	child := exec.Command("true")
	require.NoError(t, child.Start())
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	require.NoError(t, err)
	exited := instance.Info{ID: "xexited", PID: child.Process.Pid, StartTicks: 1, BootID: strings.TrimSpace(string(boot))}
	require.NoError(t, child.Wait())
	self, err := instance.Self()
	require.NoError(t, err)
	self.ID = "xalive"

	with := func(info instance.Info) map[string]string {
		l := maps.Clone(labels)
		l[sandbox.LabelInstance] = info.ID
		l[sandbox.LabelInstanceProcess] = info.Process()
		return l
	}
	leaked, err := plantContainer(ctx, b, with(exited), "", time.Now(), "sleep", "1000")
	require.NoError(t, err)
	alive, err := plantContainer(ctx, b, with(self), "", time.Now(), "sleep", "1000")
	require.NoError(t, err)
	bare := maps.Clone(labels)
	bare[sandbox.LabelInstance] = "xnorecord"
	unproven, err := plantContainer(ctx, b, bare, "", time.Now(), "sleep", "1000")
	require.NoError(t, err)

	gone := func(id, process string) (bool, string) {
		g, why, err := instance.Gone(executors, instance.ParseProcess(id, process))
		require.NoError(t, err)
		return g, why
	}
	rep, err := b.Reap(ctx, ReapOptions{Labels: labels, ExecutorGone: gone})
	require.NoError(t, err)
	assert.Equal(t, []string{leaked}, removedIDs(rep))
	left, err := b.listLabelled(ctx, labels)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{alive, unproven}, left)

	// The backend labels what it creates with its executor's record.
	b2, labels2 := newTestBackend(t, WithInstance("xmine2"), WithInstanceProcess(self.Process()))
	h, err := b2.Start(ctx, sandbox.Spec{Image: testImage, Cmd: []string{"true"}, Labels: labels2}, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.NoError(t, err)
	require.NoError(t, h.Wait(ctx).Err)
	info, _, err := b2.api.ContainerInspectWithRaw(ctx, h.ID(), false)
	require.NoError(t, err)
	assert.Equal(t, self.Process(), info.Config.Labels[sandbox.LabelInstanceProcess])
	require.NoError(t, h.Close(ctx))
}
