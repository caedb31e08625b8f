package podhelper

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testdeadline"
)

func TestAckLineRoundTrip(t *testing.T) {
	for _, c := range []Counts{{}, {Stdout: 8388612, Stderr: 3}, {Stdout: 1<<63 - 1, Stderr: 1<<63 - 1}} {
		line := AppendAck(nil, c)
		require.LessOrEqual(t, len(line), maxAckLine)
		require.True(t, bytes.HasSuffix(line, []byte{'\n'}))
		got, err := ParseAck(bytes.TrimSuffix(line, []byte{'\n'}))
		require.NoError(t, err)
		assert.Equal(t, c, got)
	}
}

func TestParseAckRefusesMalformedLines(t *testing.T) {
	for _, line := range []string{
		"", "g", "ack", "ack ", "ack 1", "ack 1 ", "ack  1 2", "ack 1  2", "ack -1 2", "ack 1 -2", "ack +1 2",
		"ack 1 2 3", "ack 0x10 2", "ack 1 2\r", "ACK 1 2", "nak 1 2", "ack 9223372036854775808 0",
		"ack 99999999999999999999 0",
	} {
		_, err := ParseAck([]byte(line))
		assert.Error(t, err, "%q", line)
	}
}

func TestCountsCovers(t *testing.T) {
	assert.True(t, Counts{Stdout: 5, Stderr: 2}.Covers(Counts{Stdout: 5, Stderr: 2}))
	assert.True(t, Counts{Stdout: 6, Stderr: 2}.Covers(Counts{Stdout: 5, Stderr: 1}))
	assert.False(t, Counts{Stdout: 4, Stderr: 9}.Covers(Counts{Stdout: 5, Stderr: 2}))
	assert.False(t, Counts{Stdout: 9, Stderr: 1}.Covers(Counts{Stdout: 5, Stderr: 2}))
}

// settleAsync runs l.settle(idle) and returns its result channel.
func settleAsync(l *ledger, idle time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() { done <- l.settle(idle) }()
	return done
}

// requirePending fails unless done stays empty for d.
func requirePending(t *testing.T, done <-chan error, d time.Duration, msg string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s: settle returned %v", msg, err)
	case <-time.After(d):
	}
}

// requireSettled waits for settle's result.
func requireSettled(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(testdeadline.Scale(10 * time.Second)): // settles in milliseconds; bounds one that never does
		t.Fatal("settle did not return")
		return nil
	}
}

func TestSettleWaitsForStreamsAndAcknowledgement(t *testing.T) {
	l := newLedger(2)
	l.forwarded(false, 100)
	l.forwarded(true, 7)
	done := settleAsync(l, time.Minute)
	l.ack(Counts{Stdout: 100, Stderr: 7})
	requirePending(t, done, 100*time.Millisecond, "streams still open")
	l.streamDone()
	l.forwarded(false, 20) // the tail, forwarded after the command exited
	l.streamDone()
	requirePending(t, done, 100*time.Millisecond, "tail not acknowledged")
	l.ack(Counts{Stdout: 119, Stderr: 7})
	requirePending(t, done, 100*time.Millisecond, "one byte short")
	l.ack(Counts{Stdout: 120, Stderr: 7})
	require.NoError(t, requireSettled(t, done))
}

func TestSettleNeverGoesBackOnAStaleAcknowledgement(t *testing.T) {
	l := newLedger(0)
	l.forwarded(false, 10)
	l.forwarded(true, 10)
	l.ack(Counts{Stdout: 10, Stderr: 3})
	l.ack(Counts{Stdout: 4, Stderr: 10}) // stale on stdout, newer on stderr
	require.NoError(t, requireSettled(t, settleAsync(l, time.Minute)))
}

func TestSettleGivesUpWhenTheSessionEnds(t *testing.T) {
	l := newLedger(0)
	l.forwarded(false, 10)
	l.ack(Counts{Stdout: 4})
	done := settleAsync(l, time.Minute)
	requirePending(t, done, 50*time.Millisecond, "session still open")
	l.close()
	err := requireSettled(t, done)
	require.ErrorIs(t, err, errAckClosed)
	assert.Contains(t, err.Error(), "4 of 10 bytes of stdout")

	// A session that ends after acknowledging everything is no failure.
	l = newLedger(0)
	l.forwarded(true, 3)
	l.ack(Counts{Stderr: 3})
	l.close()
	require.NoError(t, requireSettled(t, settleAsync(l, time.Minute)))
}

// The settle tests whose subject is time run on synctest's fake clock: a
// step is exactly as far from the last as written, however loaded the
// machine is.

func TestSettleGivesUpWithoutProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger(1)
		l.forwarded(false, 10)
		start := time.Now()
		err := requireSettled(t, settleAsync(l, 200*time.Millisecond))
		require.ErrorIs(t, err, errAckIdle)
		assert.Equal(t, 200*time.Millisecond, time.Since(start))
	})
}

func TestSettleKeepsWaitingWhileAcknowledgementsAdvance(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const idle = 300 * time.Millisecond
		l := newLedger(0)
		l.forwarded(false, 10)
		done := settleAsync(l, idle)
		// Ten steps a third of the idle period apart: three idle periods in
		// all, and never one without progress.
		for i := range 9 {
			time.Sleep(idle / 3)
			l.ack(Counts{Stdout: int64(i + 1)})
		}
		requirePending(t, done, idle/3, "acknowledgements advancing")
		l.ack(Counts{Stdout: 10})
		require.NoError(t, requireSettled(t, done))
	})
}

func TestReadAcksKeepsTheLatestAndStopsOnForeignInput(t *testing.T) {
	l := newLedger(0)
	in := "ack 5 1\n\nnot an ack\nack 9 2\nack 7 1\n"
	readAcks(strings.NewReader(in), l)
	assert.Equal(t, Counts{Stdout: 9, Stderr: 2}, l.acked)
	assert.True(t, l.closed, "the end of the input closes the ledger")

	l = newLedger(0)
	in = "ack 5 1\n" + strings.Repeat("9", 200) + "\nack 100 100\n"
	readAcks(strings.NewReader(in), l)
	assert.Equal(t, Counts{Stdout: 5, Stderr: 1}, l.acked, "an overlong line ends the reading: nothing after it counts")
	assert.True(t, l.closed)
}

// lineRecorder records each write as a line.
type lineRecorder struct {
	mu    sync.Mutex
	lines []string
	fail  error
}

func (r *lineRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return 0, r.fail
	}
	r.lines = append(r.lines, string(p))
	return len(p), nil
}

func (r *lineRecorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lines) == 0 {
		return ""
	}
	return r.lines[len(r.lines)-1]
}

func (r *lineRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lines)
}

// shortWriter accepts at most n bytes of each write.
type shortWriter struct{ n int }

func (w shortWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		return w.n, io.ErrShortWrite
	}
	return len(p), nil
}

func TestAckerCountsWhatWasDeliveredAndAcknowledgesTheLatest(t *testing.T) {
	a := NewAcker()
	var out bytes.Buffer
	stdout, stderr := a.Stdout(&out), a.Stderr(shortWriter{n: 2})
	_, err := stdout.Write([]byte("hello"))
	require.NoError(t, err)
	n, err := stderr.Write([]byte("abcd"))
	require.Error(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, Counts{Stdout: 5, Stderr: 2}, a.Counts(), "only what the writer accepted is acknowledged")

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rec := &lineRecorder{}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, rec, 50*time.Millisecond) }()
	require.Eventually(t, func() bool { return rec.last() == "ack 5 2\n" }, testdeadline.Scale(5*time.Second), 5*time.Millisecond)
	// A burst within one interval is acknowledged once, at its end.
	for range 100 {
		_, err := stdout.Write([]byte("x"))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return rec.last() == "ack 105 2\n" }, testdeadline.Scale(5*time.Second), 5*time.Millisecond)
	assert.LessOrEqual(t, rec.count(), 3, "acknowledgements are coalesced")
	time.Sleep(150 * time.Millisecond)
	assert.Equal(t, "ack 105 2\n", rec.last(), "nothing new, nothing sent")

	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

func TestAckerStopsOnAFailedWrite(t *testing.T) {
	a := NewAcker()
	ended := errors.New("session ended")
	rec := &lineRecorder{fail: ended}
	_, err := a.Stdout(io.Discard).Write([]byte("x"))
	require.NoError(t, err)
	err = a.Run(t.Context(), rec, time.Millisecond)
	require.ErrorIs(t, err, ended)
}

func TestGateFilterPassesEverythingAfterTheOpenMarker(t *testing.T) {
	var out bytes.Buffer
	seen := 0
	f := NewGateFilter(&out, func() { seen++ })
	stream := GateToken + GateToken + GateOpen + GateToken + "err\n" + GateOpen
	for i := range len(stream) {
		_, err := f.Write([]byte{stream[i]})
		require.NoError(t, err)
	}
	require.NoError(t, f.Flush())
	assert.Equal(t, 1, seen)
	assert.Equal(t, GateToken+"err\n"+GateOpen, out.String(), "the command's output is never taken for the gate's")
}
