package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/taskrun/taskrun/recovery"
)

func TestRetryLoopBacksOffWhileRunsStayKept(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The store is down for four attempts, then answers.
	kept := []int{3, 3, 3, 3, 0, 0}
	attempt := 0
	var waits []time.Duration
	after := func(d time.Duration) <-chan time.Time {
		waits = append(waits, d)
		if len(waits) == len(kept) {
			cancel()
		}
		c := make(chan time.Time, 1)
		c <- time.Time{}
		return c
	}
	b := recovery.Backoff{Initial: time.Second, Max: 4 * time.Second, Idle: time.Minute}
	recovery.RetryLoop(ctx, b, func(context.Context) int { n := kept[attempt]; attempt++; return n }, after)
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second, time.Minute, time.Minute}, waits)
}
