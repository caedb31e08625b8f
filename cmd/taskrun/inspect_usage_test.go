package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox"
)

// inspect's text shows what a run's container used, and nothing for a
// run that was not sampled.
func TestInspectShowsResourceUsage(t *testing.T) {
	rec := &runindex.Record{RunID: "r1", UserID: "u1", Status: "SUCCEEDED",
		Usage: &sandbox.Usage{CPUSeconds: 2.5, PeakMemoryBytes: 96 << 20, ReadBytes: 1 << 20, WriteBytes: 20 << 20, PeakPids: 13, Samples: 4}}
	var b bytes.Buffer
	writeRecord(&b, rec)
	assert.Contains(t, b.String(), "Resources:     CPU 2.50 s, peak memory 96MiB, I/O 1MiB read 20MiB written, peak 13 processes (4 samples)\n")

	rec.Usage = nil
	b.Reset()
	writeRecord(&b, rec)
	assert.NotContains(t, b.String(), "Resources:")
}
