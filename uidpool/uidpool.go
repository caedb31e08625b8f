// Package uidpool hands each live run a host uid/gid of its own, so that the
// kernel's per-user limits (inotify instances and watches, RLIMIT_NPROC,
// message queues, keyrings ...) are never shared by two tenants: with one uid
// for every run, one agent opening all fs.inotify.max_user_instances (128 by
// default) makes every other run's inotify_init fail with EMFILE.
//
// A Pool draws from a configured Range of uids (DefaultRange: 200000-265535,
// above the ranges distributions give to people and to subordinate-id
// allocations of rootless containers such as /etc/subuid's 100000-165535).
// Each lease is an exclusive flock(2) on a file "<uid>.lease" in the pool's
// state directory, so leases are exclusive across every executor process on
// the host that uses the same directory, and a crashed executor's leases are
// released by the kernel when its descriptors close. A uid is also skipped
// while any host process still runs as it (for instance the container of a
// crashed executor that was not reaped yet), so it is never handed to two
// live runs. The gid of a lease equals its uid.
package uidpool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Defaults of the uid range and of the host state directory.
const (
	DefaultFirst = 200000
	DefaultLast  = 265535
	// DefaultDir holds the lease files of every executor on the host.
	DefaultDir = "/var/lib/taskrun/uids"
	// leaseSuffix ends every lease file's name.
	leaseSuffix = ".lease"
)

// ErrExhausted is returned by Acquire when every uid of the range is leased
// or still in use.
var ErrExhausted = errors.New("every uid of the range is in use")

// Range is an inclusive range of host uids.
type Range struct {
	First, Last int
}

// DefaultRange is 200000-265535: 65536 uids.
func DefaultRange() Range { return Range{First: DefaultFirst, Last: DefaultLast} }

// String formats r as "FIRST-LAST", the form ParseRange reads.
func (r Range) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// Len is the number of uids in r.
func (r Range) Len() int { return r.Last - r.First + 1 }

// Validate rejects a range that is empty, reaches uid 0 to 999 (root and
// system accounts) or passes the largest uid a container can use.
func (r Range) Validate() error {
	const firstUnprivileged, maxUID = 1000, 1<<32 - 2
	switch {
	case r.First > r.Last:
		return fmt.Errorf("uid range %s is empty; give FIRST-LAST with FIRST <= LAST, e.g. %s", r, DefaultRange())
	case r.First < firstUnprivileged:
		return fmt.Errorf("uid range %s reaches system uids below %d; start it at %d or above, e.g. %s", r, firstUnprivileged, firstUnprivileged, DefaultRange())
	case r.Last > maxUID:
		return fmt.Errorf("uid range %s passes the largest uid %d", r, maxUID)
	}
	return nil
}

// ParseRange reads "FIRST-LAST", e.g. "200000-265535".
func ParseRange(s string) (Range, error) {
	first, last, ok := strings.Cut(strings.TrimSpace(s), "-")
	f, err1 := strconv.Atoi(first)
	l, err2 := strconv.Atoi(last)
	if !ok || err1 != nil || err2 != nil {
		return Range{}, fmt.Errorf("uid range %q: want FIRST-LAST, e.g. %s", s, DefaultRange())
	}
	r := Range{First: f, Last: l}
	return r, r.Validate()
}

// Pool leases uids of a Range, exclusively across the processes of a host
// that share its directory.
type Pool struct {
	r   Range
	dir string
	// inUse lists the uids of r that live host processes run as.
	inUse func(r Range) (map[int]bool, error)
}

// New returns a pool of r whose lease files live in dir, which it creates
// (mode 0700) when missing.
func New(dir string, r Range) (*Pool, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if dir == "" {
		return nil, fmt.Errorf("uid pool: empty state directory; use %s", DefaultDir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("uid pool: state directory: %w", err)
	}
	return &Pool{r: r, dir: dir, inUse: processUIDs}, nil
}

// Range is the pool's range.
func (p *Pool) Range() Range { return p.r }

// Lease is one uid/gid held by one run until Release.
type Lease struct {
	UID, GID int
	mu       sync.Mutex
	f        *os.File // nil once released
}

// User is the lease as a container user, "UID:GID".
func (l *Lease) User() string { return fmt.Sprintf("%d:%d", l.UID, l.GID) }

// Release gives the uid back. It is safe to call more than once.
func (l *Lease) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the only descriptor drops the flock
	l.f = nil
	return err
}

// Acquire leases a uid no other live lease and no host process holds. It
// starts at a random uid of the range so that concurrent executors rarely
// contend, and fails with ErrExhausted when the whole range is taken.
func (p *Pool) Acquire(ctx context.Context) (*Lease, error) {
	busy, err := p.inUse(p.r)
	if err != nil {
		return nil, fmt.Errorf("uid pool: %w", err)
	}
	n := p.r.Len()
	start := rand.IntN(n)
	for i := range n {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		uid := p.r.First + (start+i)%n
		if busy[uid] {
			continue
		}
		f, err := p.tryLock(uid)
		if err != nil {
			return nil, err
		}
		if f != nil {
			return &Lease{UID: uid, GID: uid, f: f}, nil
		}
	}
	return nil, fmt.Errorf("uid pool %s in %s: %w; widen it with --uid-range or wait for runs to end", p.r, p.dir, ErrExhausted)
}

// tryLock takes the uid's lease file, or returns nil when another lease
// holds it.
func (p *Pool) tryLock(uid int) (*os.File, error) {
	name := filepath.Join(p.dir, strconv.Itoa(uid)+leaseSuffix)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("uid pool: lease file: %w", err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		f.Close()
		return nil, nil
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("uid pool: lock %s: %w", name, err)
	}
	return f, nil
}

// processUIDs lists the real, effective, saved and filesystem uids of r that
// host processes run as, read from /proc/<pid>/status.
func processUIDs(r Range) (map[int]bool, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	busy := map[int]bool{}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // the process ended
		}
		for line := range strings.Lines(string(status)) {
			ids, ok := strings.CutPrefix(line, "Uid:")
			if !ok {
				continue
			}
			for _, f := range strings.Fields(ids) {
				if uid, err := strconv.Atoi(f); err == nil && uid >= r.First && uid <= r.Last {
					busy[uid] = true
				}
			}
			break
		}
	}
	return busy, nil
}
