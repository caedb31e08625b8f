package workerclient_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/spool"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// deadlockTimeout only detects a hang; it is never a performance assertion.
const deadlockTimeout = 45 * time.Second

// streamRetries rides out a restart's downtime with quick retries.
var streamRetries = workerclient.RetryPolicy{
	MaxAttempts:    50,
	MaxElapsed:     time.Minute,
	InitialBackoff: 5 * time.Millisecond,
	MaxBackoff:     100 * time.Millisecond,
}

// randomOutput returns n reproducible pseudo-random bytes.
func randomOutput(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, ^seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// writeInChunks writes data to s in chunks of varying size, like a container's
// demultiplexed stdout, then closes s.
func writeInChunks(s *spool.Spool, data []byte, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, seed))
	for len(data) > 0 {
		n := min(len(data), 1+rng.IntN(48<<10))
		if _, err := s.Write(data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return s.Close()
}

// pumpThroughSpool writes data into a fresh spool from one goroutine while
// Pump streams it to sender, and returns Pump's results.
func pumpThroughSpool(t *testing.T, data []byte, runID string, sender workerclient.StreamSender) (int64, error) {
	t.Helper()
	sp, err := spool.New(filepath.Join(t.TempDir(), "stdout.log"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), deadlockTimeout)
	defer cancel()
	r := sp.NewReaderContext(ctx, 0)
	defer r.Close()

	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, writeInChunks(sp, data, 7)) })
	n, err := workerclient.Pump(ctx, r, runID, sender, workerclient.PumpOptions{})
	wg.Wait()
	return n, err
}

func TestStreamDeliversEveryByteOnceInOrderUnderFaults(t *testing.T) {
	const size = 6 << 20
	data := randomOutput(size, 42)
	want := sha256.Sum256(data)

	// Faults are queued behind a few untouched POSTs so they strike mid-stream.
	pass := controlplanetest.Repeat(4, controlplanetest.Fault{Endpoint: controlplanetest.StreamEndpoint})
	stream := func(f ...controlplanetest.Fault) []controlplanetest.Fault {
		for i := range f {
			f[i].Endpoint = controlplanetest.StreamEndpoint
		}
		return append(append([]controlplanetest.Fault(nil), pass...), f...)
	}
	cases := []struct {
		name   string
		faults []controlplanetest.Fault
	}{
		{"healthy", nil},
		{"5xx", stream(controlplanetest.Repeat(3, controlplanetest.Fault{Status: http.StatusInternalServerError})...)},
		{"429 with Retry-After", stream(controlplanetest.Fault{Status: http.StatusTooManyRequests, RetryAfter: "1"})},
		{"connection resets", stream(controlplanetest.Repeat(3, controlplanetest.Fault{Reset: true})...)},
		{"answers lost after commit", stream(
			controlplanetest.Fault{AfterCommit: true, Reset: true},
			controlplanetest.Fault{AfterCommit: true, Status: http.StatusServiceUnavailable},
			controlplanetest.Fault{AfterCommit: true, Delay: 1500 * time.Millisecond})},
		{"slow server", stream(controlplanetest.Repeat(3, controlplanetest.Fault{Delay: 200 * time.Millisecond})...)},
		{"stall of several seconds", stream(controlplanetest.Fault{Delay: 3 * time.Second})},
		{"restart mid-stream", stream(controlplanetest.Fault{Restart: true, Delay: 300 * time.Millisecond})},
	}
	var healthy []byte
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp := controlplanetest.New(t, token)
			cp.InjectFaults(tc.faults...)
			c := newClient(cp.URL(), token,
				workerclient.WithRetryPolicy(streamRetries),
				workerclient.WithAttemptTimeout(time.Second))

			n, err := pumpThroughSpool(t, data, "run-s", c.Stream())
			require.NoError(t, err)

			got, ended, total := cp.Stream("run-s")
			assert.Equal(t, int64(size), n)
			assert.True(t, ended, "end marker received")
			assert.Equal(t, int64(size), total)
			assert.Equal(t, want, sha256.Sum256(got), "every byte exactly once, in order")
			assert.Zero(t, cp.PendingFaults(), "every fault was hit")
			if healthy == nil {
				healthy = got
			}
			assert.True(t, bytes.Equal(healthy, got), "same result as the healthy server")
		})
	}
}

func TestEndMarkerIsRetriedAndIdempotent(t *testing.T) {
	cp := controlplanetest.New(t, token)
	c := newClient(cp.URL(), token, workerclient.WithRetryPolicy(fastRetries))
	s := c.Stream()
	require.NoError(t, s.Send(t.Context(), "run-e", workerclient.Delta{Offset: 0, Data: []byte("hello")}))
	cp.InjectFaults(controlplanetest.Fault{AfterCommit: true, Reset: true})

	require.NoError(t, s.End(t.Context(), "run-e", 5))

	got, ended, total := cp.Stream("run-e")
	assert.Equal(t, "hello", string(got))
	assert.True(t, ended)
	assert.Equal(t, int64(5), total)
	reqs := cp.Requests("run-e")
	require.Len(t, reqs, 3)
	assert.True(t, reqs[1].End && reqs[2].End, "the end marker was sent twice")
}

func TestStreamGapIsRejectedNotRetried(t *testing.T) {
	cp := controlplanetest.New(t, token)
	c := newClient(cp.URL(), token, workerclient.WithRetryPolicy(fastRetries))

	err := c.Stream().Send(t.Context(), "run-g", workerclient.Delta{Offset: 10, Data: []byte("late")})

	var he *workerclient.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusConflict, he.StatusCode)
	assert.ErrorIs(t, err, workerclient.ErrRejected)
	assert.Len(t, cp.Requests("run-g"), 1)
	assert.Len(t, cp.Violations(), 1, "the server saw the gap")
}

func TestStalledServerNeverBlocksTheWriter(t *testing.T) {
	cp := controlplanetest.New(t, token)
	release := make(chan struct{})
	cp.InjectFaults(controlplanetest.Fault{Endpoint: controlplanetest.StreamEndpoint, Hold: release})
	c := newClient(cp.URL(), token, workerclient.WithRetryPolicy(fastRetries), workerclient.WithAttemptTimeout(time.Minute))

	sp, err := spool.New(filepath.Join(t.TempDir(), "stdout.log"))
	require.NoError(t, err)
	r := sp.NewReaderContext(t.Context(), 0)
	defer r.Close()
	type result struct {
		n   int64
		err error
	}
	pumped := make(chan result, 1)
	go func() {
		n, err := workerclient.Pump(t.Context(), r, "run-h", c.Stream(), workerclient.PumpOptions{})
		pumped <- result{n, err}
	}()

	// The whole output is written while the server holds the first POST.
	data := randomOutput(8<<20, 3)
	wrote := make(chan error, 1)
	go func() { wrote <- writeInChunks(sp, data, 5) }()
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(deadlockTimeout):
		t.Fatal("the writer blocked behind a stalled control plane")
	}
	got, _, _ := cp.Stream("run-h")
	assert.Empty(t, got, "nothing was delivered while the server stalled")

	close(release)
	select {
	case res := <-pumped:
		require.NoError(t, res.err)
		assert.Equal(t, int64(len(data)), res.n)
	case <-time.After(deadlockTimeout):
		t.Fatal("Pump did not finish after the server recovered")
	}
	got, ended, _ := cp.Stream("run-h")
	assert.True(t, ended)
	assert.Equal(t, sha256.Sum256(data), sha256.Sum256(got))
}

// recordingSender is a StreamSender that keeps copies of what it is given.
type recordingSender struct {
	mu     sync.Mutex
	deltas []workerclient.Delta
	total  int64
	ended  bool
	sent   chan struct{}
}

func (s *recordingSender) Send(_ context.Context, _ string, d workerclient.Delta) error {
	s.mu.Lock()
	s.deltas = append(s.deltas, workerclient.Delta{Offset: d.Offset, Data: bytes.Clone(d.Data)})
	s.mu.Unlock()
	s.sent <- struct{}{}
	return nil
}

func (s *recordingSender) End(_ context.Context, _ string, total int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total, s.ended = total, true
	return nil
}

func TestPumpBatchesBySizeAndByTime(t *testing.T) {
	sp, err := spool.New(filepath.Join(t.TempDir(), "stdout.log"))
	require.NoError(t, err)
	rec := &recordingSender{sent: make(chan struct{}, 1024)}
	r := sp.NewReaderContext(t.Context(), 0)
	defer r.Close()
	opts := workerclient.PumpOptions{MaxBatch: 64 << 10, FlushInterval: 20 * time.Millisecond, StartOffset: 100}
	done := make(chan error, 1)
	go func() {
		_, err := workerclient.Pump(t.Context(), r, "run-p", rec, opts)
		done <- err
	}()

	// A few bytes with no newline and no more to come are flushed by time.
	_, err = sp.Write([]byte("prompt> "))
	require.NoError(t, err)
	select {
	case <-rec.sent:
	case <-time.After(deadlockTimeout):
		t.Fatal("a partial batch was never flushed")
	}

	big := randomOutput(1<<20, 9)
	_, err = sp.Write(big)
	require.NoError(t, err)
	require.NoError(t, sp.Close())
	require.NoError(t, <-done)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Equal(t, workerclient.Delta{Offset: 100, Data: []byte("prompt> ")}, rec.deltas[0])
	var all []byte
	next := int64(100)
	for _, d := range rec.deltas {
		assert.Equal(t, next, d.Offset, "offsets are contiguous")
		assert.LessOrEqual(t, len(d.Data), opts.MaxBatch)
		next += int64(len(d.Data))
		all = append(all, d.Data...)
	}
	assert.Equal(t, append([]byte("prompt> "), big...), all)
	assert.True(t, rec.ended)
	assert.Equal(t, next, rec.total, "End carries the final offset")
	assert.GreaterOrEqual(t, len(rec.deltas), 1+(1<<20)/opts.MaxBatch, "large output is split by size")
}

func TestPumpReportsReadErrorsAndContext(t *testing.T) {
	rec := &recordingSender{sent: make(chan struct{}, 16)}
	_, err := workerclient.Pump(t.Context(), io.MultiReader(bytes.NewReader([]byte("abc")), iotestErrReader{}), "run-x", rec, workerclient.PumpOptions{})
	require.ErrorIs(t, err, errBroken)
	assert.False(t, rec.ended, "a failed read does not end the stream")
	assert.Equal(t, []workerclient.Delta{{Offset: 0, Data: []byte("abc")}}, rec.deltas, "bytes read before the error are delivered")

	sp, err := spool.New(filepath.Join(t.TempDir(), "stdout.log"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	r := sp.NewReaderContext(ctx, 0)
	defer r.Close()
	cancel()
	_, err = workerclient.Pump(ctx, r, "run-x", rec, workerclient.PumpOptions{})
	assert.ErrorIs(t, err, context.Canceled)
}

var errBroken = errors.New("disk gone")

type iotestErrReader struct{}

func (iotestErrReader) Read([]byte) (int, error) { return 0, errBroken }
