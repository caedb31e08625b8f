package executor

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// startFake starts a fake container running prog.
func startFake(t *testing.T, b *sandboxfake.Backend, prog sandboxfake.Program) sandbox.Handle {
	t.Helper()
	b.Install("/metrics-agent", prog)
	h, err := b.Start(context.Background(), sandbox.Spec{Image: "fake/agent", Cmd: []string{"/metrics-agent"}}, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

// awaitReads waits until b's containers were sampled n more times.
func awaitReads(t *testing.T, b *sandboxfake.Backend, n int64) {
	t.Helper()
	from := b.StatsReads()
	require.Eventually(t, func() bool { return b.StatsReads() >= from+n }, 10*time.Second, time.Millisecond)
}

// The sampler keeps the counters of the last sample and the highest peaks
// seen, and stops with the container: no read after the Exited hook, and
// its goroutine ended.
func TestMetricsHookKeepsPeaksAndStopsAtExit(t *testing.T) {
	b := sandboxfake.New()
	first := sandbox.Stats{CPU: time.Second, MemoryBytes: 40 << 20, PeakMemoryBytes: 50 << 20, ReadBytes: 1 << 20, WriteBytes: 2 << 20, Pids: 9}
	last := sandbox.Stats{CPU: 3 * time.Second, MemoryBytes: 8 << 20, PeakMemoryBytes: 0, ReadBytes: 4 << 20, WriteBytes: 20 << 20, Pids: 2}
	next, done := make(chan struct{}), make(chan struct{})
	h := startFake(t, b, func(_ context.Context, p *sandboxfake.Process) int {
		p.SetStats(first)
		<-next
		p.SetStats(last)
		<-done
		return 0
	})
	hook := &metricsHook{p: &plan{log: slog.New(slog.DiscardHandler)}, interval: 5 * time.Millisecond}
	hook.poststart(context.Background(), &poststartRequest{Hard: context.Background(), Handle: h})
	awaitReads(t, b, 2) // at least one read saw first
	close(next)
	awaitReads(t, b, 2) // at least one read saw last
	close(done)
	require.Zero(t, h.Wait(context.Background()).ExitCode)

	var resp exitedResponse
	require.NoError(t, hook.exited(context.Background(), &exitedRequest{}, &resp))
	require.NotNil(t, resp.Usage)
	u := *resp.Usage
	assert.InDelta(t, 3.0, u.CPUSeconds, 1e-9, "CPU time is the last sample's")
	assert.EqualValues(t, 50<<20, u.PeakMemoryBytes, "the cgroup's high-water mark is kept")
	assert.EqualValues(t, 4<<20, u.ReadBytes)
	assert.EqualValues(t, 20<<20, u.WriteBytes)
	assert.EqualValues(t, 9, u.PeakPids, "the peak pids is kept")
	assert.GreaterOrEqual(t, u.Samples, 2)

	select {
	case <-hook.done:
	default:
		t.Fatal("the sampler goroutine still runs after Exited")
	}
	reads := b.StatsReads()
	time.Sleep(20 * hook.interval)
	assert.Equal(t, reads, b.StatsReads(), "no sample after Exited")
	require.NoError(t, hook.exited(context.Background(), &exitedRequest{}, &resp), "Exited is idempotent")
}

// A container that exits ends its sampler by itself, before the Exited
// hook runs; the peak stays that of the cgroup, the memory after it lower.
func TestMetricsHookSamplerEndsWhenTheContainerExits(t *testing.T) {
	b := sandboxfake.New()
	done := make(chan struct{})
	h := startFake(t, b, func(_ context.Context, p *sandboxfake.Process) int {
		p.SetStats(sandbox.Stats{CPU: 1500 * time.Millisecond, MemoryBytes: 70 << 20, Pids: 11})
		<-done
		return 0
	})
	hook := &metricsHook{p: &plan{log: slog.New(slog.DiscardHandler)}, interval: 5 * time.Millisecond}
	hook.poststart(context.Background(), &poststartRequest{Hard: context.Background(), Handle: h})
	awaitReads(t, b, 2)
	close(done)
	h.Wait(context.Background())
	select {
	case <-hook.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sampler still runs after the container exited")
	}
	var resp exitedResponse
	require.NoError(t, hook.exited(context.Background(), &exitedRequest{}, &resp))
	require.NotNil(t, resp.Usage)
	assert.InDelta(t, 1.5, resp.Usage.CPUSeconds, 1e-9)
	assert.EqualValues(t, 70<<20, resp.Usage.PeakMemoryBytes, "without a high-water mark, the most seen")
	assert.EqualValues(t, 11, resp.Usage.PeakPids)
}

// statless hides a handle's StatsReader.
type statless struct{ sandbox.Handle }

// A handle that reads no counters gets no sampler, and the run no usage.
func TestMetricsHookWithoutStats(t *testing.T) {
	b := sandboxfake.New()
	h := startFake(t, b, func(context.Context, *sandboxfake.Process) int { return 0 })
	hook := &metricsHook{p: &plan{log: slog.New(slog.DiscardHandler)}, interval: time.Millisecond}
	hook.poststart(context.Background(), &poststartRequest{Hard: context.Background(), Handle: statless{h}})
	h.Wait(context.Background())
	var resp exitedResponse
	require.NoError(t, hook.exited(context.Background(), &exitedRequest{}, &resp))
	assert.Nil(t, resp.Usage)
	assert.Zero(t, b.StatsReads())
}

// OnUsage hears the usage so far after each live sample, before the run
// ends: what a live run's client reads.
func TestMetricsHookReportsLiveUsage(t *testing.T) {
	b := sandboxfake.New()
	done := make(chan struct{})
	h := startFake(t, b, func(_ context.Context, p *sandboxfake.Process) int {
		p.SetStats(sandbox.Stats{CPU: 2 * time.Second, MemoryBytes: 30 << 20, Pids: 4})
		<-done
		return 0
	})
	heard := make(chan sandbox.Usage, 100)
	hook := &metricsHook{p: &plan{log: slog.New(slog.DiscardHandler), in: Input{OnUsage: func(u sandbox.Usage) {
		select {
		case heard <- u:
		default:
		}
	}}}, interval: 5 * time.Millisecond}
	hook.poststart(context.Background(), &poststartRequest{Hard: context.Background(), Handle: h})
	var u sandbox.Usage
	require.Eventually(t, func() bool {
		select {
		case u = <-heard:
		default:
		}
		return u.CPUSeconds == 2
	}, 10*time.Second, time.Millisecond)
	assert.EqualValues(t, 30<<20, u.PeakMemoryBytes)
	assert.EqualValues(t, 4, u.PeakPids)
	close(done)
	require.Zero(t, h.Wait(context.Background()).ExitCode)
	var resp exitedResponse
	require.NoError(t, hook.exited(context.Background(), &exitedRequest{}, &resp))
}
