package timings_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/timings"
)

// clock is a test clock that moves only when told to.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestSpansAreOffsetsFromTheOriginOnTheInjectedClock(t *testing.T) {
	c := newClock()
	r := timings.New(c.Now)
	c.advance(2 * time.Millisecond)
	stop := r.Start(timings.Prepare)
	c.advance(1500 * time.Microsecond)
	inner := r.Start(timings.DiskCap)
	c.advance(250 * time.Microsecond)
	inner()
	c.advance(time.Millisecond)
	stop()
	stop() // a second stop records nothing more

	assert.Equal(t, []timings.Span{
		{Phase: timings.Prepare, StartMS: 2, DurationMS: 2.75},
		{Phase: timings.DiskCap, StartMS: 3.5, DurationMS: 0.25},
	}, r.Spans())
	assert.InDelta(t, 4.75, timings.Total(r.Spans()), 1e-9)
	began, ok := r.Began(timings.DiskCap)
	require.True(t, ok)
	assert.Equal(t, r.Origin().Add(3500*time.Microsecond), began)
	_, ok = r.Began(timings.Wait)
	assert.False(t, ok)
}

func TestTimeRecordsThePhaseAndPassesItsError(t *testing.T) {
	c := newClock()
	r := timings.New(c.Now)
	want := assert.AnError
	err := r.Time(timings.Collect, func() error { c.advance(3 * time.Millisecond); return want })
	assert.ErrorIs(t, err, want)
	s, ok := timings.Find(r.Spans(), timings.Collect)
	require.True(t, ok)
	assert.Equal(t, 3.0, s.DurationMS)
}

func TestSpansAreOrderedByStartWhateverOrderTheyEnd(t *testing.T) {
	c := newClock()
	r := timings.New(c.Now)
	outer := r.Start(timings.Launch)
	c.advance(time.Millisecond)
	r.Since(timings.Create, r.Origin().Add(500*time.Microsecond))
	c.advance(time.Millisecond)
	outer()
	var phases []string
	for _, s := range r.Spans() {
		phases = append(phases, s.Phase)
	}
	assert.Equal(t, []string{timings.Launch, timings.Create}, phases)
}

func TestAnEndBeforeItsBeginIsAZeroSpan(t *testing.T) {
	c := newClock()
	r := timings.New(c.Now)
	begin := c.Now().Add(time.Millisecond)
	r.Add(timings.Wait, begin, c.Now())
	assert.Equal(t, []timings.Span{{Phase: timings.Wait, StartMS: 1, DurationMS: 0}}, r.Spans())
}

func TestFirstWriteRecordsOnlyTheFirstNonEmptyWrite(t *testing.T) {
	c := newClock()
	r := timings.New(c.Now)
	var buf bytes.Buffer
	w := r.FirstWrite(&buf, timings.FirstByte, c.Now())
	c.advance(time.Millisecond)
	_, err := w.Write(nil)
	require.NoError(t, err)
	c.advance(time.Millisecond)
	_, err = w.Write([]byte("x"))
	require.NoError(t, err)
	c.advance(time.Millisecond)
	_, err = w.Write([]byte("y"))
	require.NoError(t, err)
	assert.Equal(t, "xy", buf.String(), "every byte passes through")
	assert.Equal(t, []timings.Span{{Phase: timings.FirstByte, StartMS: 0, DurationMS: 2}}, r.Spans())
}

func TestANilRecorderRecordsNothing(t *testing.T) {
	var r *timings.Recorder
	r.Start(timings.Prepare)()
	r.Since(timings.Wait, time.Now())
	require.NoError(t, r.Time(timings.Collect, func() error { return nil }))
	var buf bytes.Buffer
	assert.Same(t, &buf, r.FirstWrite(&buf, timings.FirstByte, time.Now()))
	assert.Nil(t, r.Spans())
	assert.False(t, r.Now().IsZero())
}

func TestTheContextCarriesTheRecorder(t *testing.T) {
	r := timings.New(nil)
	assert.Same(t, r, timings.FromContext(timings.NewContext(context.Background(), r)))
	assert.Nil(t, timings.FromContext(context.Background()))
}

func TestConcurrentPhasesAllLand(t *testing.T) {
	r := timings.New(nil)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() { r.Start(timings.Persist)() })
	}
	wg.Wait()
	assert.Len(t, r.Spans(), 16)
}
