package executor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/timings"
)

// tickingClock moves one millisecond each time it is read, so every span of
// a run has a length and they are ordered as the phases read it.
type tickingClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *tickingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Millisecond)
	return c.now
}

// Every phase of a run is timed, on the clock the caller injects, and the
// spans reach the Outcome and the run's index record.
func TestPhasesAreTimed(t *testing.T) {
	u := newUnit(t)
	u.b.Install(model.ContainerHelpersDir+"/"+executor.ProbeBinary, probeProgram(confinedReport()))
	in := u.input("timed1", nil)
	in.Helpers = standInHelpers(t)
	clock := &tickingClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	in.Timings = timings.New(clock.Now)

	out, err := executor.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, "agent ran\n", out.Result.OutputStr)

	spans := map[string]timings.Span{}
	for _, s := range out.Timings {
		if _, ok := spans[s.Phase]; !ok {
			spans[s.Phase] = s
		}
		assert.GreaterOrEqual(t, s.StartMS, 0.0, s.Phase)
		assert.GreaterOrEqual(t, s.DurationMS, 0.0, s.Phase)
	}
	for _, phase := range []string{
		timings.Plan, timings.Preflight, timings.Admit, timings.Journal, timings.Prepare,
		timings.Materialize, timings.Snapshot, timings.Gateway, timings.Launch, timings.Create,
		timings.Start, timings.SelfCheck, timings.FirstByte, timings.LiveAudit, timings.Wait,
		timings.Records, timings.Drain, timings.Remove, timings.Collect, timings.KeepLocal, timings.Persist,
		timings.Release, timings.Report, timings.Index,
	} {
		assert.Contains(t, spans, phase, "phase %s is timed", phase)
	}
	within := func(inner, outer string) {
		i, o := spans[inner], spans[outer]
		assert.GreaterOrEqual(t, i.StartMS, o.StartMS, "%s starts within %s", inner, outer)
		assert.LessOrEqual(t, i.StartMS+i.DurationMS, o.StartMS+o.DurationMS, "%s ends within %s", inner, outer)
	}
	within(timings.Materialize, timings.Prepare)
	// The engine creates the container on a goroutine of its own, started
	// once the run directory was reserved: the create starts after prepare
	// began (how far the two overlap is the scheduler's) and has ended
	// before the container starts.
	create, prepare := spans[timings.Create], spans[timings.Prepare]
	assert.GreaterOrEqual(t, create.StartMS, prepare.StartMS, "create starts once prepare began")
	assert.LessOrEqual(t, create.StartMS+create.DurationMS, spans[timings.Start].StartMS, "create ends before start")
	within(timings.Start, timings.Launch)
	within(timings.KeepLocal, timings.Collect)
	within(timings.Persist, timings.Collect)
	assert.Less(t, spans[timings.Prepare].StartMS, spans[timings.Launch].StartMS, "prepare runs before the container")
	assert.Less(t, spans[timings.Wait].StartMS, spans[timings.Collect].StartMS, "collect runs after the container")
	// The spans read the injected clock: nothing is longer than the ticks
	// the run read.
	assert.Less(t, timings.Total(out.Timings), float64(time.Hour/time.Millisecond))

	// The index record, written just before the final PATCH (which ends a
	// leased run's lease and with it the run's writes), holds every phase
	// up to it.
	rec, err := runindex.Find(context.Background(), u.store, "timed1", "user1")
	require.NoError(t, err)
	stored := map[string]bool{}
	for _, s := range rec.Timings {
		stored[s.Phase] = true
	}
	for _, phase := range []string{timings.Prepare, timings.Create, timings.Start, timings.LiveAudit, timings.SelfCheck, timings.Wait, timings.Persist, timings.Release} {
		assert.True(t, stored[phase], "the index record holds %s: %v", phase, rec.Timings)
	}
}

// A run refused before it started still says what it spent.
func TestRefusedRunIsTimed(t *testing.T) {
	u := newUnit(t, sandboxfake.WithImages("fake/other"))
	in := u.input("timed2", nil)
	out, err := executor.Execute(context.Background(), in)
	require.Error(t, err)
	_, ok := timings.Find(out.Timings, timings.Preflight)
	assert.True(t, ok, "the image check is timed: %v", out.Timings)
	_, ok = timings.Find(out.Timings, timings.Prepare)
	assert.False(t, ok, "nothing was prepared")
}
