package podhelper

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The acknowledgement protocol keeps the run container alive until the
// executor has every byte of its output. The attach stream ends when the
// container exits, and whatever is still in flight to an executor that reads
// behind the container is then lost; so the gate does not exit with its
// command.
//
// The gate forwards the command's stdout and stderr through pipes of its own
// and counts the bytes it writes to the container's stdout and, after its
// open marker (GateOpen), to its stderr. The executor counts what it
// receives on the same two streams (stderr after the marker) and writes
// those counts back on the attach stdin, the same channel that released the
// gate, as lines "ack STDOUT STDERR\n" (Acker). When the command has exited,
// the gate kills what it left behind, forwards the rest of the pipes and
// waits until an acknowledgement covers everything it forwarded; only then
// does it exit, with the command's status.
//
// Bounds: the gate gives up waiting when nothing moves (no byte forwarded,
// no acknowledgement advancing) for an idle period, or at once when its
// stdin ends (the executor's session is gone: the run container's stdin is
// StdinOnce). The command cannot forge an acknowledgement: its stdin is
// /dev/null and the gate is not dumpable, so the command, although it runs
// as the same user, cannot open the gate's descriptors through /proc.

// Counts are the bytes that crossed the run container's stdout and stderr.
type Counts struct {
	Stdout int64
	Stderr int64
}

// Covers reports whether c is at least o on both streams.
func (c Counts) Covers(o Counts) bool { return c.Stdout >= o.Stdout && c.Stderr >= o.Stderr }

// ackPrefix starts every acknowledgement line.
const ackPrefix = "ack "

// maxAckLine bounds an acknowledgement line, newline included: two decimal
// int64 values and the prefix fit with room to spare.
const maxAckLine = 64

// DefaultAckIdle is how long the gate waits, once its command exited, while
// neither its forwarding nor the executor's acknowledgements make progress.
const DefaultAckIdle = 30 * time.Second

// ackInterval is the least time between two acknowledgements the executor
// sends.
const ackInterval = 20 * time.Millisecond

// AppendAck appends c to b as one acknowledgement line.
func AppendAck(b []byte, c Counts) []byte {
	b = append(b, ackPrefix...)
	b = strconv.AppendInt(b, c.Stdout, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, c.Stderr, 10)
	return append(b, '\n')
}

// ParseAck parses one acknowledgement line, without its newline.
func ParseAck(line []byte) (Counts, error) {
	rest, ok := bytes.CutPrefix(line, []byte(ackPrefix))
	if !ok {
		return Counts{}, fmt.Errorf("not an acknowledgement: %q", line)
	}
	out, errs, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		return Counts{}, fmt.Errorf("acknowledgement without a stderr count: %q", line)
	}
	var c Counts
	var err error
	if c.Stdout, err = parseCount(out); err != nil {
		return Counts{}, err
	}
	if c.Stderr, err = parseCount(errs); err != nil {
		return Counts{}, err
	}
	return c, nil
}

// parseCount parses a non-negative decimal count, digits only.
func parseCount(b []byte) (int64, error) {
	if len(b) == 0 || len(b) > 19 {
		return 0, fmt.Errorf("bad count %q", b)
	}
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, fmt.Errorf("bad count %q", b)
		}
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad count %q: %w", b, err)
	}
	return n, nil
}

// Acker is the executor's half: it counts the bytes received from the run
// container on each stream and acknowledges them to the gate. It keeps two
// counters whatever the output's size.
type Acker struct {
	stdout, stderr atomic.Int64
	kick           chan struct{}
}

// NewAcker returns an Acker with nothing received.
func NewAcker() *Acker { return &Acker{kick: make(chan struct{}, 1)} }

// Stdout wraps w, where the run container's stdout is delivered, counting
// what w accepted.
func (a *Acker) Stdout(w io.Writer) io.Writer { return &ackCounter{a: a, w: w, n: &a.stdout} }

// Stderr wraps w, where the run container's stderr after the gate's marker
// is delivered (GateFilter's output), counting what w accepted.
func (a *Acker) Stderr(w io.Writer) io.Writer { return &ackCounter{a: a, w: w, n: &a.stderr} }

// Counts is what was received so far.
func (a *Acker) Counts() Counts { return Counts{Stdout: a.stdout.Load(), Stderr: a.stderr.Load()} }

// Run writes an acknowledgement to w whenever the counts changed, at most
// one per interval (0: ackInterval), until ctx ends or a write fails.
func (a *Acker) Run(ctx context.Context, w io.Writer, interval time.Duration) error {
	if interval <= 0 {
		interval = ackInterval
	}
	var last Counts
	buf := make([]byte, 0, maxAckLine)
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-a.kick:
		}
		c := a.Counts()
		if c == last {
			continue
		}
		if _, err := w.Write(AppendAck(buf[:0], c)); err != nil {
			return fmt.Errorf("acknowledge output: %w", err)
		}
		last = c
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(interval):
		}
	}
}

// ackCounter counts what its writer accepted and wakes the Acker.
type ackCounter struct {
	a *Acker
	w io.Writer
	n *atomic.Int64
}

// Write implements io.Writer.
func (c *ackCounter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if n > 0 {
		c.n.Add(int64(n))
		select {
		case c.a.kick <- struct{}{}:
		default:
		}
	}
	return n, err
}

// ledger is the gate's half: what it forwarded, what the executor
// acknowledged, and whether both can still move.
type ledger struct {
	mu      sync.Mutex
	sent    Counts
	acked   Counts
	open    int  // streams still being forwarded
	closed  bool // the executor's stdin ended: no acknowledgement will come
	changed chan struct{}
}

// newLedger returns a ledger for streams forwarded streams.
func newLedger(streams int) *ledger {
	return &ledger{open: streams, changed: make(chan struct{}, 1)}
}

// poke wakes settle; called with mu held.
func (l *ledger) poke() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// forwarded records n bytes written to the container's stdout or stderr.
func (l *ledger) forwarded(stderr bool, n int) {
	if n <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if stderr {
		l.sent.Stderr += int64(n)
	} else {
		l.sent.Stdout += int64(n)
	}
	l.poke()
}

// ack records an acknowledgement; counts never go back.
func (l *ledger) ack(c Counts) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.Stdout <= l.acked.Stdout && c.Stderr <= l.acked.Stderr {
		return
	}
	l.acked.Stdout = max(l.acked.Stdout, c.Stdout)
	l.acked.Stderr = max(l.acked.Stderr, c.Stderr)
	l.poke()
}

// streamDone records that one forwarded stream reached its end.
func (l *ledger) streamDone() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	l.poke()
}

// close records that no acknowledgement can come any more.
func (l *ledger) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.poke()
}

// Errors of settle.
var (
	errAckClosed = errors.New("the executor's session ended before it acknowledged all output")
	errAckIdle   = errors.New("no progress forwarding or acknowledging output")
)

// settle waits until every stream was forwarded to its end and the executor
// acknowledged all of it. It gives up when the executor's session ended
// first, or when nothing moved for idle.
func (l *ledger) settle(idle time.Duration) error {
	timer := time.NewTimer(idle)
	defer timer.Stop()
	for {
		l.mu.Lock()
		sent, acked, open, closed := l.sent, l.acked, l.open, l.closed
		l.mu.Unlock()
		if open <= 0 && acked.Covers(sent) {
			return nil
		}
		if closed && !acked.Covers(sent) {
			return fmt.Errorf("%w (%d of %d bytes of stdout, %d of %d of stderr)", errAckClosed, acked.Stdout, sent.Stdout, acked.Stderr, sent.Stderr)
		}
		select {
		case <-l.changed:
			timer.Reset(idle)
		case <-timer.C:
			return fmt.Errorf("%w for %s (%d of %d bytes of stdout, %d of %d of stderr acknowledged)", errAckIdle, idle, acked.Stdout, sent.Stdout, acked.Stderr, sent.Stderr)
		}
	}
}

// readAcks reads acknowledgement lines from r into l until r ends, then
// closes l. Lines that do not parse are ignored; a line longer than any
// acknowledgement ends the reading, as r then carries something else.
func readAcks(r io.Reader, l *ledger) {
	defer l.close()
	br := bufio.NewReaderSize(r, maxAckLine)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return
		}
		if c, err := ParseAck(bytes.TrimSuffix(line, []byte{'\n'})); err == nil {
			l.ack(c)
		}
	}
}

// countingWriter writes to the container's stdout or stderr and records
// what was written in the ledger.
type countingWriter struct {
	mu     sync.Mutex
	w      io.Writer
	l      *ledger
	stderr bool
}

// Write implements io.Writer.
func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.w.Write(p)
	c.l.forwarded(c.stderr, n)
	return n, err
}
