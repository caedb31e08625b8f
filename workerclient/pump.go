package workerclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// PumpOptions tunes Pump. Zero values take the defaults.
type PumpOptions struct {
	// MaxBatch is the most bytes one Send carries (default 256 KiB).
	MaxBatch int
	// FlushInterval is the longest a byte waits in a partial batch (default 50ms).
	FlushInterval time.Duration
	// StartOffset is the stream offset of r's first byte, when resuming (default 0).
	StartOffset int64
}

const (
	defaultMaxBatch      = 256 << 10
	defaultFlushInterval = 50 * time.Millisecond
	pumpReadSize         = 64 << 10
	pumpReadAhead        = 4
)

func (o PumpOptions) withDefaults() PumpOptions {
	if o.MaxBatch <= 0 {
		o.MaxBatch = defaultMaxBatch
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = defaultFlushInterval
	}
	return o
}

// Pump reads r (typically a spool.Reader following the container's stdout)
// until io.EOF and delivers the bytes to s: batches of at most MaxBatch bytes,
// each flushed when full or FlushInterval after its first byte arrived, sent
// with contiguous offsets; then End with the total. It returns the number of
// bytes Send accepted.
//
// Reading runs ahead of sending by a few bounded buffers, so a slow sender only
// delays delivery: the bytes wait in r (on disk for a spool), never in memory,
// and the writer of the spool is never blocked. Send must not retain d.Data
// after returning. When ctx ends Pump returns ctx's error at once; the read
// goroutine exits when r.Read returns, which a spool.Reader made with the same
// ctx does immediately.
func Pump(ctx context.Context, r io.Reader, taskRunID string, s StreamSender, opts PumpOptions) (int64, error) {
	opts = opts.withDefaults()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	free := make(chan []byte, pumpReadAhead)
	for range pumpReadAhead {
		free <- make([]byte, min(pumpReadSize, opts.MaxBatch))
	}
	chunks := make(chan chunk, pumpReadAhead)
	go readChunks(ctx, r, free, chunks)

	p := &pumper{s: s, id: taskRunID, opts: opts, off: opts.StartOffset, batch: make([]byte, 0, opts.MaxBatch)}
	err := p.run(ctx, free, chunks)
	return p.off - opts.StartOffset, err
}

// chunk is one Read result handed from the read goroutine to the sender.
type chunk struct {
	buf []byte // the free-list buffer; data is buf[:n]
	n   int
	err error
}

// readChunks reads r into buffers taken from free and hands them over in order.
func readChunks(ctx context.Context, r io.Reader, free <-chan []byte, out chan<- chunk) {
	for {
		var buf []byte
		select {
		case buf = <-free:
		case <-ctx.Done():
			return
		}
		n, err := r.Read(buf)
		select {
		case out <- chunk{buf: buf, n: n, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// pumper is Pump's sending side.
type pumper struct {
	s     StreamSender
	id    string
	opts  PumpOptions
	off   int64 // offset of batch[0]: every byte before it was accepted by Send
	batch []byte
	timer *time.Timer
}

func (p *pumper) run(ctx context.Context, free chan<- []byte, chunks <-chan chunk) error {
	defer p.stopTimer()
	for {
		var flushC <-chan time.Time
		if p.timer != nil {
			flushC = p.timer.C
		}
		select {
		case c := <-chunks:
			if err := p.add(ctx, c.buf[:c.n]); err != nil {
				return err
			}
			free <- c.buf
			if c.err != nil {
				return p.finish(ctx, c.err)
			}
		case <-flushC:
			p.timer = nil
			if err := p.flush(ctx); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// add appends data to the batch, sending every batch that fills up.
func (p *pumper) add(ctx context.Context, data []byte) error {
	for len(data) > 0 {
		n := min(len(data), p.opts.MaxBatch-len(p.batch))
		p.batch = append(p.batch, data[:n]...)
		data = data[n:]
		if len(p.batch) == p.opts.MaxBatch {
			if err := p.flush(ctx); err != nil {
				return err
			}
		}
	}
	if len(p.batch) > 0 && p.timer == nil {
		p.timer = time.NewTimer(p.opts.FlushInterval)
	}
	return nil
}

// flush sends the pending batch, if any.
func (p *pumper) flush(ctx context.Context) error {
	p.stopTimer()
	if len(p.batch) == 0 {
		return nil
	}
	if err := p.s.Send(ctx, p.id, Delta{Offset: p.off, Data: p.batch}); err != nil {
		return fmt.Errorf("pump run %s: %w", p.id, err)
	}
	p.off += int64(len(p.batch))
	p.batch = p.batch[:0]
	return nil
}

// finish sends what is left and, at io.EOF, ends the stream.
func (p *pumper) finish(ctx context.Context, readErr error) error {
	if err := p.flush(ctx); err != nil {
		return err
	}
	if !errors.Is(readErr, io.EOF) {
		return fmt.Errorf("pump run %s: read output at offset %d: %w", p.id, p.off, readErr)
	}
	if err := p.s.End(ctx, p.id, p.off); err != nil {
		return fmt.Errorf("pump run %s: %w", p.id, err)
	}
	return nil
}

func (p *pumper) stopTimer() {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}
