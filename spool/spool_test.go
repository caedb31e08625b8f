package spool_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/spool"
)

// deadlockTimeout only detects a hang; it is never a performance assertion.
const deadlockTimeout = 30 * time.Second

func newSpool(t *testing.T) *spool.Spool {
	t.Helper()
	s, err := spool.New(filepath.Join(t.TempDir(), "stdout.log"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// writeRandom writes total pseudo-random bytes in chunks of varying size and
// returns their SHA-256.
func writeRandom(w io.Writer, total int, seed uint64) ([32]byte, error) {
	var sum [32]byte
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h := sha256.New()
	buf := make([]byte, 64<<10)
	for written := 0; written < total; {
		n := min(1+rng.IntN(len(buf)), total-written)
		for i := range buf[:n] {
			buf[i] = byte(rng.Uint32())
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return sum, err
		}
		h.Write(buf[:n])
		written += n
	}
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

func TestConcurrentWriterAndReadersAreByteExact(t *testing.T) {
	const total = 50 << 20
	s := newSpool(t)

	const readers = 3
	sums := make([][32]byte, readers)
	counts := make([]int64, readers)
	errs := make([]error, readers)
	var wg sync.WaitGroup
	for i := range readers {
		r := s.NewReader(0)
		t.Cleanup(func() { _ = r.Close() })
		wg.Go(func() {
			h := sha256.New()
			// Each reader uses a different buffer size to vary interleavings.
			counts[i], errs[i] = io.CopyBuffer(h, r, make([]byte, 1000+i*7919))
			copy(sums[i][:], h.Sum(nil))
		})
	}

	want, err := writeRandom(s, total, 1)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	wg.Wait()

	assert.Equal(t, int64(total), s.Size())
	for i := range readers {
		require.NoError(t, errs[i], "reader %d", i)
		assert.Equal(t, int64(total), counts[i], "reader %d byte count", i)
		assert.Equal(t, want, sums[i], "reader %d SHA-256", i)
	}
}

func TestStalledReaderDoesNotBlockWriter(t *testing.T) {
	s := newSpool(t)
	stalled := s.NewReader(0)
	t.Cleanup(func() { _ = stalled.Close() })
	// Read one byte so the reader is established, then never read again.
	_, err := s.Write([]byte("x"))
	require.NoError(t, err)
	one := make([]byte, 1)
	_, err = stalled.Read(one)
	require.NoError(t, err)

	done := make(chan [32]byte, 1)
	go func() {
		sum, err := writeRandom(s, 20<<20, 2)
		assert.NoError(t, err)
		assert.NoError(t, s.Close())
		done <- sum
	}()
	var want [32]byte
	select {
	case want = <-done:
	case <-time.After(deadlockTimeout):
		t.Fatal("writer blocked behind a reader that stopped reading")
	}

	// The stalled reader still gets every byte later.
	h := sha256.New()
	n, err := io.Copy(h, stalled)
	require.NoError(t, err)
	assert.Equal(t, int64(20<<20), n)
	assert.Equal(t, want[:], h.Sum(nil))
}

func TestPartialFinalWriteWithoutNewlineIsDelivered(t *testing.T) {
	s := newSpool(t)
	r := s.NewReader(0)
	t.Cleanup(func() { _ = r.Close() })

	_, err := s.Write([]byte("line one\nno newline at the end"))
	require.NoError(t, err)

	// The partial line is readable before Close: readers do not wait for '\n'.
	buf := make([]byte, 100)
	n, err := r.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "line one\nno newline at the end", string(buf[:n]))

	require.NoError(t, s.Close())
	n, err = r.Read(buf)
	assert.Equal(t, 0, n)
	assert.ErrorIs(t, err, io.EOF)
}

func TestReadBlocksUntilWriteThenEOFAfterClose(t *testing.T) {
	s := newSpool(t)
	r := s.NewReader(0)
	t.Cleanup(func() { _ = r.Close() })

	got := make(chan []byte)
	go func() {
		b, err := io.ReadAll(r)
		assert.NoError(t, err)
		got <- b
	}()
	for _, chunk := range []string{"a", "bc", "def"} {
		_, err := s.Write([]byte(chunk))
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())
	select {
	case b := <-got:
		assert.Equal(t, "abcdef", string(b))
	case <-time.After(deadlockTimeout):
		t.Fatal("reader did not reach EOF after Close")
	}
}

func TestReaderAtOffsetAndAfterClose(t *testing.T) {
	s := newSpool(t)
	_, err := s.Write([]byte("0123456789"))
	require.NoError(t, err)
	require.NoError(t, s.Close())

	r := s.NewReader(4)
	t.Cleanup(func() { _ = r.Close() })
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, "456789", string(b))
	assert.Equal(t, int64(10), r.Offset())

	_, err = s.Write([]byte("late"))
	assert.ErrorIs(t, err, spool.ErrClosed)
	assert.NoError(t, s.Close(), "Close is idempotent")
}

func TestReadHonoursContextAndReaderClose(t *testing.T) {
	s := newSpool(t)

	ctx, cancel := context.WithCancel(t.Context())
	r := s.NewReaderContext(ctx, 0)
	t.Cleanup(func() { _ = r.Close() })
	errc := make(chan error, 1)
	go func() {
		_, err := r.Read(make([]byte, 8))
		errc <- err
	}()
	cancel()
	select {
	case err := <-errc:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(deadlockTimeout):
		t.Fatal("Read ignored context cancellation")
	}

	r2 := s.NewReader(0)
	go func() {
		_, err := r2.Read(make([]byte, 8))
		errc <- err
	}()
	require.NoError(t, r2.Close())
	select {
	case err := <-errc:
		assert.True(t, errors.Is(err, spool.ErrReaderClosed), "got %v", err)
	case <-time.After(deadlockTimeout):
		t.Fatal("Read ignored reader Close")
	}
}

func TestBadInputNamesTheFix(t *testing.T) {
	_, err := spool.New(filepath.Join(t.TempDir(), "missing-dir", "stdout.log"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "directory must exist")

	s := newSpool(t)
	_, err = s.NewReader(-1).Read(make([]byte, 1))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "negative")
}

func BenchmarkWrite(b *testing.B) {
	for _, size := range []int{4 << 10, 32 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			s, err := spool.New(filepath.Join(b.TempDir(), "stdout.log"))
			require.NoError(b, err)
			defer s.Close()
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := s.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkWriteWithFollowingReader(b *testing.B) {
	s, err := spool.New(filepath.Join(b.TempDir(), "stdout.log"))
	require.NoError(b, err)
	r := s.NewReader(0)
	defer r.Close()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, r)
		done <- err
	}()
	buf := make([]byte, 32<<10)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := s.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	require.NoError(b, s.Close())
	require.NoError(b, <-done)
}

// A spool with a limit keeps the first bytes up to it and counts, without
// keeping or refusing, everything past it.
func TestSpoolLimitKeepsHeadAndCountsTheRest(t *testing.T) {
	s, err := spool.New(filepath.Join(t.TempDir(), "out"), spool.WithLimit(10))
	require.NoError(t, err)
	for _, chunk := range []string{"0123", "456789ab", "cdef"} {
		n, err := s.Write([]byte(chunk))
		require.NoError(t, err, "a flood past the limit is never refused")
		assert.Equal(t, len(chunk), n)
	}
	require.NoError(t, s.Close())
	assert.EqualValues(t, 10, s.Size())
	assert.EqualValues(t, 6, s.Dropped())
	data, err := os.ReadFile(s.Path())
	require.NoError(t, err)
	assert.Equal(t, "0123456789", string(data))
}

// fixedBudget grants from a fixed number of bytes, like a run's
// records.Budget shared with other records.
type fixedBudget struct{ left int64 }

func (b *fixedBudget) Take(n int64) int64 {
	got := min(n, b.left)
	b.left -= got
	return got
}

// Two spools sharing a budget keep together no more than it grants; what is
// refused is counted, never refused to the writer.
func TestSpoolsShareABudget(t *testing.T) {
	b := &fixedBudget{left: 12}
	dir := t.TempDir()
	out, err := spool.New(filepath.Join(dir, "out"), spool.WithLimit(100), spool.WithBudget(b))
	require.NoError(t, err)
	errs, err := spool.New(filepath.Join(dir, "err"), spool.WithBudget(b))
	require.NoError(t, err)
	for _, w := range []struct {
		s     *spool.Spool
		chunk string
	}{{out, "01234567"}, {errs, "abcdefgh"}, {out, "89"}} {
		n, err := w.s.Write([]byte(w.chunk))
		require.NoError(t, err)
		assert.Equal(t, len(w.chunk), n)
	}
	require.NoError(t, out.Close())
	require.NoError(t, errs.Close())
	assert.EqualValues(t, 8, out.Size())
	assert.EqualValues(t, 4, errs.Size())
	assert.EqualValues(t, 2, out.Dropped())
	assert.EqualValues(t, 4, errs.Dropped())
	data, err := os.ReadFile(errs.Path())
	require.NoError(t, err)
	assert.Equal(t, "abcd", string(data))
}
