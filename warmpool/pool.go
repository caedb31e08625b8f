// Package warmpool keeps hardened containers started ahead of the runs they
// will serve, so that a run's agent starts within milliseconds of the run
// claiming one.
//
// For each key (a Template: image, policy, helpers, disk cap, timeout,
// labels: everything that shapes a container) the pool keeps up to
// Config.PerKey slots ready, and no more than Config.MaxSlots in all (with
// Config.MemoryBudget, as many as the key's recent claims, within the
// budget's memory: see Config.MemoryBudget). A slot
// is filled in the background, in this order:
//
//  1. a host uid is leased for it (with Template.LeaseUIDs), never shared
//     with another live container;
//  2. its run directory is created under Config.Dir, on its own
//     loop-mounted filesystem of Template.DiskLimit bytes (the cold path's
//     disk cap), with home, artifacts, global and output owned by the uid,
//     and an empty gate directory holding a unix socket the host listens on;
//  3. the container is created exactly as a cold run's (the same policy,
//     mounts and labels, plus dev.taskrun.pool), attached to and started
//     with the self-check as its command, in gate mode (probe.GateFlag): the
//     self-check observes the sandbox, reports over the socket and waits;
//  4. the report is checked against Template.Expect and the live container
//     against the audit rules (Template.Audit): a slot that fails either is
//     destroyed and counted (Stats.AuditFailures), never offered.
//
// Claim hands a ready slot to exactly one run, which owns it from then on:
// it materializes the workspace into Slot.Dir, starts its gateway there,
// then calls Slot.Release with the run's container spec. Release routes the
// container's output to the run's streams (attached since before the
// start, so no byte is lost), then sends the gate the run's self-check
// arguments and environment; the gate checks the sandbox again, reports
// with the run's nonce exactly as a cold run's self-check does, and
// replaces itself with the agent. A slot serves one run: its container is
// removed when the run ends, and the pool fills another in the background.
//
// Parked containers cost their processes (the container's init and the
// waiting self-check: 6 pids with the self-check's threads, about 2 MiB of
// memory, no CPU), the engine's shim on the host, and their slot's
// disk-cap image (Template.DiskLimit bytes, fully allocated, as a cold run
// allocates it). Config.PerKey and Config.MaxSlots bound both. Parked
// containers older than Config.MaxIdle are replaced, so each one's
// dev.taskrun.expires label holds; after a crash `taskrun gc` removes the
// containers (by their executor's instance label) and Sweep their slot
// directories.
package warmpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/taskrun/taskrun/internal/backoff"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/uidpool"
)

// Defaults of Config.
const (
	DefaultPerKey          = 2
	DefaultMaxSlots        = 8
	DefaultMaxIdle         = 30 * time.Minute
	DefaultParkTimeout     = time.Minute
	DefaultFillConcurrency = 2
)

// fillBackoff spaces the fills of a key whose fills keep failing.
var fillBackoff = backoff.Exponential{Initial: 200 * time.Millisecond, Max: time.Minute, Jitter: true}

// Errors of the pool.
var (
	// ErrEmpty is returned by Claim when no slot of the key is ready; the
	// run goes the cold path, and the pool fills slots for the key.
	ErrEmpty = errors.New("warmpool: no ready container for this run's key")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("warmpool: pool is closed")
	// ErrAudit is wrapped when a filled container failed its self-check
	// or its live audit; it is destroyed and counted.
	ErrAudit = errors.New("warmpool: parked container failed its isolation checks")
	// ErrConfig is wrapped by errors about Config or a Template the pool
	// cannot serve.
	ErrConfig = errors.New("warmpool: bad configuration")
)

// Config configures a Pool.
type Config struct {
	// Backend runs the containers; it must implement sandbox.Parker (the
	// Docker backend does). With sandbox.EngineDescriber the audit reads
	// the engine's host facts.
	Backend sandbox.Backend
	// Dir holds the slots' run directories (each on its own disk cap); an
	// absolute path, typically the runs root's "pool" directory. The pool
	// works under Dir/Instance, which Sweep removes once the executor is
	// gone.
	Dir string
	// Instance is the executor's instance ID (package instance); it must be
	// the one the Backend labels containers with, so gc can tell whose
	// parked containers are left after a crash.
	Instance string
	// DiskCapTemplates is the directory of the pre-formatted images the
	// slots' disk caps are copied from (diskcap.WithTemplates), typically
	// the runs root's "diskcap" directory; empty formats each with
	// mkfs.ext4.
	DiskCapTemplates string
	// UIDs leases each slot a host uid for Templates with LeaseUIDs.
	UIDs *uidpool.Pool
	// PerKey is how many ready slots each key keeps; DefaultPerKey when 0.
	// With a MemoryBudget it is the most a key keeps.
	PerKey int
	// MemoryBudget, when positive, sizes the keys from their recent demand
	// instead: each key wanted keeps as many slots as it had claims (runs
	// served warm or not) in the last DemandWindow, at least one, up to
	// PerKey, while the slots of all keys hold at most MemoryBudget bytes
	// of memory limits (a parked container keeps its run's memory limit,
	// Template.Policy.MemoryBytes). When demand is over the budget, the
	// budget is shared a slot at a time, the most demanded key first; ready
	// slots over a key's share are removed (Stats.Shrunk).
	MemoryBudget int64
	// DemandWindow is how far back claims count as a key's demand;
	// DefaultDemandWindow when 0.
	DemandWindow time.Duration
	// MaxSlots caps the parked and filling slots of all keys together;
	// DefaultMaxSlots when 0.
	MaxSlots int
	// MaxIdle is how long a slot may wait for a run before it is replaced,
	// and how long a key is kept warm after its last claim; DefaultMaxIdle
	// when 0.
	MaxIdle time.Duration
	// ParkTimeout bounds filling one slot; DefaultParkTimeout when 0.
	ParkTimeout time.Duration
	// FillConcurrency caps slots filled at once; DefaultFillConcurrency
	// when 0.
	FillConcurrency int
	// Logger receives the pool's log; slog.Default() when nil.
	Logger *slog.Logger
}

// Stats are the pool's counters since New.
type Stats struct {
	// Ready and Filling are the slots parked and being filled now.
	Ready   int `json:"ready"`
	Filling int `json:"filling"`
	// Claims counts slots handed to runs; Misses counts Claims that found
	// none ready.
	Claims int `json:"claims"`
	Misses int `json:"misses"`
	// Filled counts slots that became ready.
	Filled int `json:"filled"`
	// AuditFailures counts slots destroyed because their self-check or
	// live audit failed; FillFailures those that failed otherwise.
	AuditFailures int `json:"audit_failures"`
	FillFailures  int `json:"fill_failures"`
	// Died counts parked containers that exited before a run claimed them;
	// Recycled those replaced after MaxIdle.
	Died     int `json:"died"`
	Recycled int `json:"recycled"`
	// Shrunk counts ready slots removed because their key's share of the
	// MemoryBudget fell below them.
	Shrunk int `json:"shrunk"`
}

// Pool keeps slots ready per key. It is safe for concurrent use.
type Pool struct {
	cfg    Config
	parker sandbox.Parker
	dir    string
	log    *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{}
	done   chan struct{}
	fills  sync.WaitGroup
	// destroys counts slots being destroyed in the background (died or
	// recycled); Close waits for them. Added to under mu.
	destroys sync.WaitGroup

	mu      sync.Mutex
	keys    map[string]*keyState
	filling int
	closed  bool
	stats   Stats
}

// keyState is one key's template and slots.
type keyState struct {
	key      string
	tmpl     Template
	ready    []*Slot
	filling  int
	lastUsed time.Time
	failures int
	retryAt  time.Time
	// claims are the times of the key's recent claims (MemoryBudget).
	claims []time.Time
}

// maxClaimTimes bounds keyState.claims.
const maxClaimTimes = 1024

// New starts a pool; Close stops it and removes every parked container.
func New(cfg Config) (*Pool, error) {
	parker, ok := cfg.Backend.(sandbox.Parker)
	if !ok {
		return nil, fmt.Errorf("%w: backend %T cannot park containers (it is no sandbox.Parker)", ErrConfig, cfg.Backend)
	}
	if !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("%w: Dir %q must be an absolute path, e.g. the runs root's pool directory", ErrConfig, cfg.Dir)
	}
	if cfg.Instance == "" {
		return nil, fmt.Errorf("%w: Instance is required: the executor's instance ID, which its backend labels containers with", ErrConfig)
	}
	cfg.PerKey = orDefault(cfg.PerKey, DefaultPerKey)
	cfg.MaxSlots = orDefault(cfg.MaxSlots, DefaultMaxSlots)
	cfg.FillConcurrency = orDefault(cfg.FillConcurrency, DefaultFillConcurrency)
	if cfg.MaxIdle <= 0 {
		cfg.MaxIdle = DefaultMaxIdle
	}
	if cfg.ParkTimeout <= 0 {
		cfg.ParkTimeout = DefaultParkTimeout
	}
	if cfg.DemandWindow <= 0 {
		cfg.DemandWindow = DefaultDemandWindow
	}
	if cfg.MemoryBudget < 0 {
		return nil, fmt.Errorf("%w: MemoryBudget %d: give 0 (PerKey slots per key) or a number of bytes", ErrConfig, cfg.MemoryBudget)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	dir := filepath.Join(cfg.Dir, cfg.Instance)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("warmpool: create %s: %w", dir, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{
		cfg: cfg, parker: parker, dir: dir, log: log.With("component", "warmpool"),
		ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{}),
		keys: map[string]*keyState{},
	}
	go p.loop()
	return p, nil
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// SetMemoryBudget sets Config.MemoryBudget of a running pool (for a pool
// its owner did not configure, such as an executor.Host's): positive sizes
// the keys from their recent demand within that many bytes, 0 goes back to
// PerKey slots per key.
func (p *Pool) SetMemoryBudget(bytes int64) error {
	if bytes < 0 {
		return fmt.Errorf("%w: MemoryBudget %d: give 0 (PerKey slots per key) or a number of bytes", ErrConfig, bytes)
	}
	p.mu.Lock()
	p.cfg.MemoryBudget = bytes
	p.mu.Unlock()
	p.kick()
	return nil
}

// Backend is the backend the pool's containers run on; a run uses the pool
// only when its own Sandbox is this backend.
func (p *Pool) Backend() sandbox.Backend { return p.cfg.Backend }

// UIDs is the uid pool the slots lease from (Config.UIDs), nil without one.
func (p *Pool) UIDs() *uidpool.Pool { return p.cfg.UIDs }

// Warm asks the pool to keep slots of t ready from now on (until MaxIdle
// passes without a claim), without claiming one.
func (p *Pool) Warm(t Template) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if err := p.check(t); err != nil {
		return err
	}
	p.want(t)
	return nil
}

// check refuses a template the pool cannot fill.
func (p *Pool) check(t Template) error {
	if t.LeaseUIDs && p.cfg.UIDs == nil {
		return fmt.Errorf("%w: the run leases a host uid per run but the pool has no UIDs; give the pool the runs' uidpool.Pool", ErrConfig)
	}
	if t.Gate == "" {
		return fmt.Errorf("%w: a warm container needs the self-check (Template.Gate): give the run its helpers", ErrConfig)
	}
	return nil
}

// want registers t's key (caller holds mu) and wakes the filler.
func (p *Pool) want(t Template) *keyState {
	key := t.Key()
	ks, ok := p.keys[key]
	if !ok {
		ks = &keyState{key: key, tmpl: t}
		p.keys[key] = ks
	}
	ks.lastUsed = time.Now()
	p.kick()
	return ks
}

// Claim hands a ready slot of t's key to the caller, who owns it from then
// on (see Slot). With none ready it returns ErrEmpty, and the pool starts
// keeping slots of that key.
func (p *Pool) Claim(ctx context.Context, t Template) (*Slot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if err := p.check(t); err != nil {
		return nil, err
	}
	ks := p.want(t)
	if len(ks.claims) == maxClaimTimes {
		ks.claims = ks.claims[1:]
	}
	ks.claims = append(ks.claims, time.Now())
	for len(ks.ready) > 0 {
		s := ks.ready[0]
		ks.ready = ks.ready[1:]
		if !s.claim() {
			continue // died meanwhile; its watcher destroys it
		}
		p.stats.Claims++
		return s, nil
	}
	p.stats.Misses++
	return nil, ErrEmpty
}

// Ready is how many slots of t's key are ready now.
func (p *Pool) Ready(t Template) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ks, ok := p.keys[t.Key()]; ok {
		return len(ks.ready)
	}
	return 0
}

// WaitReady waits until n slots of t's key are ready (n at most PerKey),
// registering the key like Warm.
func (p *Pool) WaitReady(ctx context.Context, t Template, n int) error {
	if err := p.Warm(t); err != nil {
		return err
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for p.Ready(t) < min(n, p.cfg.PerKey) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("warmpool: %d of %d slots ready: %w (%+v)", p.Ready(t), n, ctx.Err(), p.Stats())
		case <-tick.C:
		}
	}
	return nil
}

// Stats returns the pool's counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Filling = p.filling
	for _, ks := range p.keys {
		s.Ready += len(ks.ready)
	}
	return s
}

// kick wakes the filler.
func (p *Pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// loop fills and recycles slots until Close.
func (p *Pool) loop() {
	defer close(p.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		p.schedule()
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		case <-tick.C:
		}
	}
}

// schedule recycles slots past MaxIdle, forgets keys unused for MaxIdle
// and starts fills where a key lacks slots, within the caps.
func (p *Pool) schedule() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	now := time.Now()
	total := p.filling
	for _, ks := range p.keys {
		for len(ks.ready) > 0 && now.Sub(ks.ready[0].parkedAt) > p.cfg.MaxIdle {
			s := ks.ready[0]
			ks.ready = ks.ready[1:]
			if s.claim() {
				p.stats.Recycled++
				p.destroys.Add(1)
				go func() {
					defer p.destroys.Done()
					_ = s.destroy(context.Background(), "idle past MaxIdle")
				}()
			}
		}
		total += len(ks.ready)
		if len(ks.ready) == 0 && ks.filling == 0 && now.Sub(ks.lastUsed) > p.cfg.MaxIdle {
			delete(p.keys, ks.key)
		}
	}
	target := func(*keyState) int { return p.cfg.PerKey }
	if p.cfg.MemoryBudget > 0 {
		total -= p.shrink(now)
		share := p.shares(now)
		target = func(ks *keyState) int { return share[ks.key] }
	}
	for _, ks := range p.keys {
		for len(ks.ready)+ks.filling < target(ks) && total < p.cfg.MaxSlots &&
			p.filling < p.cfg.FillConcurrency && !now.Before(ks.retryAt) && now.Sub(ks.lastUsed) <= p.cfg.MaxIdle {
			ks.filling++
			p.filling++
			total++
			p.fills.Add(1)
			go p.fillOne(ks)
		}
	}
}

// shares sizes the keys from their recent demand within the memory
// budget (caller holds mu).
func (p *Pool) shares(now time.Time) map[string]int {
	demand := make([]keyDemand, 0, len(p.keys))
	for _, ks := range p.keys {
		var n int
		ks.claims, n = recentClaims(ks.claims, now, p.cfg.DemandWindow)
		demand = append(demand, keyDemand{key: ks.key, demand: max(n, 1), cost: slotCost(ks.tmpl)})
	}
	return sizeKeys(demand, p.cfg.MemoryBudget, p.cfg.PerKey, p.cfg.MaxSlots)
}

// shrink removes ready slots over their key's share, the oldest first, so
// that the budget they hold can go to the keys in demand; it returns how
// many (caller holds mu).
func (p *Pool) shrink(now time.Time) int {
	share := p.shares(now)
	n := 0
	for _, ks := range p.keys {
		for len(ks.ready) > 0 && len(ks.ready)+ks.filling > share[ks.key] {
			s := ks.ready[0]
			ks.ready = ks.ready[1:]
			if !s.claim() {
				continue
			}
			n++
			p.stats.Shrunk++
			p.destroys.Add(1)
			go func() {
				defer p.destroys.Done()
				_ = s.destroy(context.Background(), "over its key's share of the memory budget")
			}()
		}
	}
	return n
}

// fillOne fills a slot for ks and parks it.
func (p *Pool) fillOne(ks *keyState) {
	defer p.fills.Done()
	// Not cancelled by Close, which waits instead: a create request cut
	// short may leave a container the pool never learns the ID of.
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ParkTimeout)
	s, err := p.fill(ctx, ks.key, ks.tmpl)
	cancel()
	p.mu.Lock()
	ks.filling--
	p.filling--
	switch {
	case err != nil:
		if errors.Is(err, ErrAudit) {
			p.stats.AuditFailures++
		} else {
			p.stats.FillFailures++
		}
		ks.failures++
		ks.retryAt = time.Now().Add(fillBackoff.Delay(ks.failures))
	case p.closed:
		s.claim()
	default:
		ks.failures = 0
		ks.ready = append(ks.ready, s)
		p.stats.Filled++
	}
	closed := p.closed
	p.mu.Unlock()
	if err != nil {
		if !closed {
			p.log.Warn("warm container not ready; destroyed", "key", ks.key, "err", err)
		}
		return
	}
	if closed {
		s.destroy(context.Background(), "pool closed")
		return
	}
	go s.watch()
	p.kick()
}

// died is called by a slot's watcher when its gate's connection ended. It
// reports whether the slot was still parked, i.e. its container died: then
// it is no longer offered, and the watcher destroys it and calls
// p.destroys.Done. A claimed or closed slot is left alone.
func (p *Pool) died(s *Slot) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !s.claim() {
		return false
	}
	p.destroys.Add(1)
	if ks, ok := p.keys[s.key]; ok {
		for i, r := range ks.ready {
			if r == s {
				ks.ready = append(ks.ready[:i:i], ks.ready[i+1:]...)
				break
			}
		}
	}
	p.stats.Died++
	p.kick()
	return true
}

// Close stops filling and destroys every parked container and its slot;
// slots already claimed belong to their runs. It waits for fills in
// progress.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var parked []*Slot
	for _, ks := range p.keys {
		for _, s := range ks.ready {
			if s.claim() {
				parked = append(parked, s)
			}
		}
		ks.ready = nil
	}
	p.mu.Unlock()
	p.cancel()
	<-p.done
	p.fills.Wait()
	var errs []error
	for _, s := range parked {
		errs = append(errs, s.destroy(ctx, "pool closed"))
	}
	p.destroys.Wait()
	if err := os.Remove(p.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.log.Debug("pool directory not removed", "dir", p.dir, "err", err)
	}
	return errors.Join(errs...)
}
