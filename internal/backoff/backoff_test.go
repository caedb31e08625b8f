package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/taskrun/taskrun/internal/backoff"
)

func TestDelayDoublesUpToMax(t *testing.T) {
	e := backoff.Exponential{Initial: 100 * time.Millisecond, Max: 800 * time.Millisecond}
	var got []time.Duration
	for n := 0; n <= 6; n++ {
		got = append(got, e.Delay(n))
	}
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{100 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, 800 * ms, 800 * ms}, got)
}

func TestDelayCapsWithoutOverflow(t *testing.T) {
	e := backoff.Exponential{Initial: 3 * time.Second, Max: math.MaxInt64}
	assert.Equal(t, time.Duration(math.MaxInt64), e.Delay(1000))

	e = backoff.Exponential{Initial: time.Minute, Max: time.Second}
	assert.Equal(t, time.Second, e.Delay(1), "Max caps even the first wait")
}

func TestDelayIsZeroWithoutInitialOrMax(t *testing.T) {
	for _, e := range []backoff.Exponential{
		{},
		{Max: time.Second, Jitter: true},
		{Initial: -time.Second, Max: time.Second},
		{Initial: time.Second},
		{Initial: time.Second, Max: -time.Second, Jitter: true},
	} {
		assert.Zero(t, e.Delay(3), "%+v", e)
	}
}

func TestJitteredDelayStaysInUpperHalf(t *testing.T) {
	e := backoff.Exponential{Initial: 100 * time.Millisecond, Max: 800 * time.Millisecond, Jitter: true}
	ceilings := []time.Duration{100, 200, 400, 800, 800}
	for i := 0; i < 200; i++ {
		for n, ceil := range ceilings {
			ceil *= time.Millisecond
			d := e.Delay(n + 1)
			assert.GreaterOrEqual(t, d, ceil/2, "retry %d", n+1)
			assert.LessOrEqual(t, d, ceil, "retry %d", n+1)
		}
	}
}

func TestJitterVaries(t *testing.T) {
	e := backoff.Exponential{Initial: time.Second, Max: time.Second, Jitter: true}
	seen := map[time.Duration]bool{}
	for i := 0; i < 20; i++ {
		seen[e.Delay(1)] = true
	}
	assert.Greater(t, len(seen), 1)
}

func TestTinyDelaysAreNotJittered(t *testing.T) {
	e := backoff.Exponential{Initial: 1, Max: 1, Jitter: true}
	assert.Equal(t, time.Duration(1), e.Delay(5))
}
