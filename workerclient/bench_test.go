package workerclient_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/spool"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// BenchmarkStreamThroughput pumps 256 MiB from a closed spool to the local
// control plane over HTTP, and compares it with io.Copy of the same bytes
// through an os.Pipe. It reports pump_MB/s, pipe_MB/s and pump/pipe; ns/op
// covers both plus per-iteration setup and is not a throughput figure.
func BenchmarkStreamThroughput(b *testing.B) {
	const size = 256 << 20
	data := randomOutput(size, 11)
	sp, err := spool.New(filepath.Join(b.TempDir(), "stdout.log"))
	require.NoError(b, err)
	_, err = sp.Write(data)
	require.NoError(b, err)
	require.NoError(b, sp.Close())

	var pumpTime, pipeTime time.Duration
	run := 0
	for b.Loop() {
		run++
		pumpTime += pumpOnce(b, sp, run)
		pipeTime += pipeOnce(b, data)
	}
	pumpMBs := float64(size) * float64(run) / pumpTime.Seconds() / 1e6
	pipeMBs := float64(size) * float64(run) / pipeTime.Seconds() / 1e6
	b.ReportMetric(pumpMBs, "pump_MB/s")
	b.ReportMetric(pipeMBs, "pipe_MB/s")
	b.ReportMetric(pumpMBs/pipeMBs, "pump/pipe")
}

// pumpOnce streams the spool to a fresh control plane and returns the time taken.
func pumpOnce(b *testing.B, sp *spool.Spool, run int) time.Duration {
	cp := controlplanetest.New(b, token)
	c := newClient(cp.URL(), token)
	r := sp.NewReader(0)
	defer r.Close()
	start := time.Now()
	n, err := workerclient.Pump(b.Context(), r, "bench", c.Stream(), workerclient.PumpOptions{})
	elapsed := time.Since(start)
	require.NoError(b, err)
	require.Equal(b, sp.Size(), n)
	_, ended, total := cp.Stream("bench")
	require.True(b, ended, "run %d", run)
	require.Equal(b, sp.Size(), total)
	return elapsed
}

// pipeOnce copies data through an os.Pipe and returns the time taken.
func pipeOnce(b *testing.B, data []byte) time.Duration {
	pr, pw, err := os.Pipe()
	require.NoError(b, err)
	defer pr.Close()
	start := time.Now()
	go func() {
		_, _ = io.Copy(pw, bytes.NewReader(data))
		_ = pw.Close()
	}()
	n, err := io.Copy(io.Discard, pr)
	elapsed := time.Since(start)
	require.NoError(b, err)
	require.Equal(b, int64(len(data)), n)
	return elapsed
}
