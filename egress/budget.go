package egress

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// budget holds a run's byte and connection allowance.
type budget struct {
	maxBytes int64
	maxConns int

	mu       sync.Mutex
	bytes    int64
	conns    int
	exceeded error
}

func newBudget(maxBytes int64, maxConns int) *budget {
	if maxBytes == 0 {
		maxBytes = DefaultMaxBytes
	}
	if maxConns == 0 {
		maxConns = DefaultMaxConnections
	}
	return &budget{maxBytes: maxBytes, maxConns: maxConns}
}

// admit counts one connection attempt; it fails once the connection budget
// is spent or the byte budget is exhausted.
func (b *budget) admit() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.exceeded != nil {
		return b.exceeded
	}
	if b.conns >= b.maxConns {
		b.exceeded = fmt.Errorf("%w: the run's connection budget of %d is spent (raise max_connections in the egress policy)", ErrBudgetExceeded, b.maxConns)
		return b.exceeded
	}
	b.conns++
	return nil
}

// take reserves up to n bytes, or fails once the byte budget is spent;
// settle returns what the caller did not use.
func (b *budget) take(n int) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.exceeded != nil {
		return 0, b.exceeded
	}
	left := b.maxBytes - b.bytes
	if left <= 0 {
		b.exceeded = b.bytesSpent()
		return 0, b.exceeded
	}
	if int64(n) > left {
		n = int(left)
	}
	b.bytes += int64(n)
	return n, nil
}

// left is what remains of the byte budget, or the error once it is spent.
// It reserves nothing.
func (b *budget) left() (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.exceeded != nil {
		return 0, b.exceeded
	}
	left := b.maxBytes - b.bytes
	if left <= 0 {
		b.exceeded = b.bytesSpent()
		return 0, b.exceeded
	}
	return left, nil
}

// charge counts n bytes that arrived. Concurrent readers may together
// receive more than remains; charge then accepts only what fits, ends the
// budget and returns the error, and the caller drops the rest.
func (b *budget) charge(n int) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	left := b.maxBytes - b.bytes
	if left < 0 {
		left = 0
	}
	if int64(n) <= left {
		b.bytes += int64(n)
		return n, nil
	}
	b.bytes = b.maxBytes
	if b.exceeded == nil {
		b.exceeded = b.bytesSpent()
	}
	return int(left), b.exceeded
}

// bytesSpent is the error of a spent byte budget.
func (b *budget) bytesSpent() error {
	return fmt.Errorf("%w: the run's byte budget of %d bytes is spent (raise max_bytes in the egress policy)", ErrBudgetExceeded, b.maxBytes)
}

// settle gives back the part of a reservation that moved no bytes.
func (b *budget) settle(reserved, used int) {
	if used < reserved {
		b.mu.Lock()
		b.bytes -= int64(reserved - used)
		b.mu.Unlock()
	}
}

func (b *budget) err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.exceeded
}

// meteredConn is an upstream connection that charges every byte to the
// run's budget and to its own counters, and stops when the budget is spent.
type meteredConn struct {
	net.Conn
	budget *budget
	up     atomic.Int64
	down   atomic.Int64
}

// Read charges only the bytes that arrive: waiting for data reserves
// nothing, so an idle connection leaves the whole budget to the others.
// Bytes past the budget are dropped and the connection reports the budget
// error.
func (c *meteredConn) Read(p []byte) (int, error) {
	left, err := c.budget.left()
	if err != nil {
		return 0, err
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	got, rerr := c.Conn.Read(p)
	n, err := c.budget.charge(got)
	c.down.Add(int64(n))
	if err != nil {
		return n, err
	}
	return n, rerr
}

func (c *meteredConn) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		n, err := c.budget.take(len(p) - written)
		if err != nil {
			return written, err
		}
		// Counted before the write: the upstream may answer (and the entry be
		// recorded) before Write returns, and it has these bytes by then.
		c.up.Add(int64(n))
		sent, err := c.Conn.Write(p[written : written+n])
		written += sent
		c.up.Add(int64(sent - n))
		c.budget.settle(n, sent)
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// CloseWrite half-closes the upstream connection when it supports it.
func (c *meteredConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
