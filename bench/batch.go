package main

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// runConcurrently calls each with 1..total from workers goroutines, each
// taking the next number when its call returns, and reports the wall time
// of the whole batch with every worker's first error.
func runConcurrently(total, workers int, each func(i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	start := time.Now()
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(total) {
					return
				}
				if err := each(int(i)); err != nil && errs[g] == nil {
					errs[g] = err
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}
