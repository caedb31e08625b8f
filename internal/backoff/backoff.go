// Package backoff computes the waits between retries of a failing operation.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Exponential is a capped exponential backoff: the wait before the first
// retry is Initial and it doubles for each further retry, up to Max. The zero
// value never waits.
type Exponential struct {
	// Initial is the wait before the first retry.
	Initial time.Duration
	// Max caps every wait.
	Max time.Duration
	// Jitter draws each wait uniformly from [d/2, d], where d is the capped
	// exponential wait, so that callers that failed together do not retry in
	// lockstep. Waits of 1ns or less are not jittered.
	Jitter bool
}

// Delay returns the wait before retry number n (1-based; n < 1 counts as 1).
// It is never negative: a non-positive Initial or Max means no wait.
func (e Exponential) Delay(n int) time.Duration {
	if e.Initial <= 0 || e.Max <= 0 {
		return 0
	}
	d := min(e.Initial, e.Max)
	for i := 1; i < n && d < e.Max; i++ {
		if d > e.Max/2 {
			d = e.Max
		} else {
			d *= 2
		}
	}
	if !e.Jitter || d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
