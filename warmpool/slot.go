package warmpool

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/internal/unixsock"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/probe"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/workspace"
)

// The gate's socket, relative to the slot's run directory (and to
// model.ContainerRunDir inside the container). The host removes it as soon
// as the gate connected: a parked slot's run directory holds nothing of it.
const (
	gateDir  = ".gate"
	gateSock = "gate.sock"
)

// gateWriteTimeout bounds sending the claim to a parked gate.
const gateWriteTimeout = 10 * time.Second

// ErrReleased is returned by a second Release of a slot.
var ErrReleased = errors.New("warmpool: slot was already released")

// slot states.
const (
	stateParked = iota
	stateClaimed
	stateReleased
	stateClosed
)

// Slot is one container parked for a run, with its run directory, disk cap
// and host uid. Once claimed, the run owns it: the directory, its disk cap
// (Unmount) and the uid lease are released by the run exactly as a cold
// run releases its own; the container is removed by closing the Handle
// Release returns, or by Close when the run never released it.
type Slot struct {
	pool     *Pool
	key      string
	id       string
	dir      string
	owner    workspace.Owner
	user     string
	lease    *uidpool.Lease
	unmount  func() error
	parked   sandbox.Parked
	ln       net.Listener
	conn     net.Conn
	hello    probe.GateHello
	parkedAt time.Time

	mu    sync.Mutex
	state int
}

// ID is the slot's name: the container's dev.taskrun.run label and its run
// directory's last element.
func (s *Slot) ID() string { return s.id }

// Dir is the slot's run directory on the host, mounted at
// model.ContainerRunDir; its home, artifacts, global and output exist and
// belong to Owner.
func (s *Slot) Dir() string { return s.dir }

// Owner is the uid/gid the container runs as and that owns its directories.
func (s *Slot) Owner() workspace.Owner { return s.owner }

// User is the container's user, "UID:GID".
func (s *Slot) User() string { return s.user }

// Lease is the slot's host uid lease, nil without Template.LeaseUIDs. The
// claiming run releases it once the container is gone.
func (s *Slot) Lease() *uidpool.Lease { return s.lease }

// Unmount releases the slot's disk-cap filesystem (unmounting it and
// removing its image, see diskcap.Mount); nil when the directory has none.
func (s *Slot) Unmount() func() error { return s.unmount }

// ContainerID is the parked container's ID.
func (s *Slot) ContainerID() string { return s.parked.ID() }

// GateReport is what the self-check observed when the container parked.
func (s *Slot) GateReport() probe.Report { return s.hello.Report }

// claim moves a parked slot to claimed; false when it is not parked.
func (s *Slot) claim() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateParked {
		return false
	}
	s.state = stateClaimed
	return true
}

// Release starts the run in the claimed slot: the container's output goes
// to streams from now on (with anything it printed while parked first), the
// clock of spec.Timeout starts, and the gate receives spec's self-check
// command line (spec.Wrapper in front of the run's command) and spec.Env;
// the socket is removed. spec is the run's container as the cold path would
// start it: only its Wrapper, Entrypoint, Cmd, Env, Timeout and StopGrace
// are used, the rest was fixed by the Template. The returned Handle is the
// run's container: Wait for it and Close it as for Backend.Start.
func (s *Slot) Release(ctx context.Context, spec sandbox.Spec, streams sandbox.Streams) (sandbox.Handle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateClaimed {
		return nil, ErrReleased
	}
	s.state = stateReleased
	argv, err := s.parked.Activate(ctx, spec, streams)
	if err != nil {
		s.closeGate()
		return nil, fmt.Errorf("activate parked container: %w", err)
	}
	msg := probe.GateClaim{Argv: argv, Env: spec.Env}
	_ = s.conn.SetWriteDeadline(time.Now().Add(gateWriteTimeout))
	err = json.NewEncoder(s.conn).Encode(msg)
	s.closeGate()
	if err != nil {
		return nil, fmt.Errorf("release the gate of container %s: %w", shortID(s.parked.ID()), err)
	}
	return s.parked, nil
}

// Close removes the container of a claimed slot that was never released,
// and its gate; after Release it does nothing (close the Handle instead).
// The run directory, disk cap and lease stay the run's to release.
func (s *Slot) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateClaimed {
		return nil
	}
	s.state = stateClosed
	s.closeGate()
	return s.parked.Close(ctx)
}

// Discard destroys a claimed slot that no run took over: container, gate,
// run directory, disk cap and lease.
func (s *Slot) Discard(ctx context.Context) error {
	s.mu.Lock()
	if s.state != stateClaimed {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	return s.destroy(ctx, "discarded by its run")
}

// closeGate closes the gate's connection and listener and removes its
// socket; the caller holds mu.
func (s *Slot) closeGate() {
	if s.conn != nil {
		s.conn.Close()
	}
	if s.ln != nil {
		s.ln.Close()
	}
	_ = os.RemoveAll(filepath.Join(s.dir, gateDir))
}

// watch waits on the parked gate's connection: the gate sends nothing
// after its hello, so anything but a claim ending it means the container
// died (or misbehaves), and the slot is destroyed.
func (s *Slot) watch() {
	var b [1]byte
	_, _ = s.conn.Read(b[:])
	if s.pool.died(s) {
		defer s.pool.destroys.Done()
		_ = s.destroy(context.Background(), "its gate went away while parked")
	}
}

// destroy removes everything of a slot no run owns: container, gate, run
// directory and disk cap, then the uid lease.
func (s *Slot) destroy(ctx context.Context, why string) error {
	s.mu.Lock()
	s.state = stateClosed
	s.mu.Unlock()
	s.pool.log.Debug("destroying warm container", "slot", s.id, "why", why)
	var errs []error
	if s.conn != nil {
		s.conn.Close()
	}
	if s.ln != nil {
		s.ln.Close()
	}
	if s.parked != nil {
		errs = append(errs, s.parked.Close(ctx))
	}
	if s.unmount != nil {
		errs = append(errs, s.unmount())
	}
	if s.dir != "" {
		errs = append(errs, os.RemoveAll(s.dir))
	}
	if s.lease != nil {
		// Only once the container is gone: a uid never serves two live
		// containers.
		errs = append(errs, s.lease.Release())
	}
	return errors.Join(errs...)
}

// fill makes a slot for t and parks it; on error nothing of it is left.
func (p *Pool) fill(ctx context.Context, key string, t Template) (s *Slot, err error) {
	id := "pool-" + strings.ToLower(rand.Text()[:16])
	s = &Slot{pool: p, key: key, id: id, owner: t.Owner, user: t.Policy.User}
	defer func() {
		if err != nil {
			if derr := s.destroy(context.WithoutCancel(ctx), "fill failed"); derr != nil {
				p.log.Warn("clean up a failed warm container", "slot", id, "err", derr)
			}
		}
	}()
	policy := t.Policy
	expect := t.Expect
	if t.LeaseUIDs {
		if s.lease, err = p.cfg.UIDs.Acquire(ctx); err != nil {
			return s, fmt.Errorf("lease a host uid: %w", err)
		}
		s.owner = workspace.Owner{UID: s.lease.UID, GID: s.lease.GID}
		s.user = s.lease.User()
		policy.User = s.user
		uid := s.lease.UID
		expect.UID = &uid
	}
	if err := s.makeDir(ctx, p.dir, t.DiskLimit, p.cfg.DiskCapTemplates); err != nil {
		return s, err
	}
	if s.ln, err = unixsock.Listen(filepath.Join(s.dir, gateDir, gateSock), s.owner.UID); err != nil {
		return s, fmt.Errorf("gate socket: %w", err)
	}
	spec := sandbox.Spec{
		Name:       "taskrun-" + id,
		Run:        model.RunRef{RunID: id},
		Image:      t.Image,
		Entrypoint: []string{t.Gate, probe.GateFlag, model.ContainerRunDir + "/" + gateDir + "/" + gateSock},
		WorkingDir: t.WorkingDir,
		Mounts:     append([]sandbox.Mount{{Source: s.dir, Target: model.ContainerRunDir}}, t.Mounts...),
		Labels:     maps.Clone(t.Labels),
		// The expiry label must cover the wait for a claim as well.
		Timeout:   t.Timeout + p.cfg.MaxIdle,
		StopGrace: t.StopGrace,
	}
	if spec.Labels == nil {
		spec.Labels = map[string]string{}
	}
	spec.Labels[sandbox.LabelPool] = key
	spec.Labels[sandbox.LabelRunDir] = s.dir
	if s.parked, err = p.parker.Park(ctx, spec, policy); err != nil {
		return s, fmt.Errorf("park container: %w", err)
	}
	if err := s.awaitGate(ctx); err != nil {
		return s, err
	}
	if err := p.audit(ctx, s, t, expect); err != nil {
		return s, err
	}
	s.parkedAt = time.Now()
	return s, nil
}

// makeDir creates the slot's run directory under its disk cap (copied from
// the templates in templates, when set), as a cold run's prepare phase
// does, with the run's subdirectories.
func (s *Slot) makeDir(ctx context.Context, parent string, limit int64, templates string) error {
	s.dir = filepath.Join(parent, s.id)
	dirs := workspace.RunDirsAt(s.dir)
	if err := workspace.CreateRunDir(dirs); err != nil {
		return fmt.Errorf("create slot directory: %w", err)
	}
	if limit > 0 {
		if err := diskcap.Admit(parent, limit+diskcap.ImageOverhead); err != nil {
			return err
		}
		var opts []diskcap.Option
		if templates != "" {
			opts = append(opts, diskcap.WithTemplates(templates))
		}
		unmount, err := diskcap.Mount(ctx, s.dir, limit, opts...)
		switch {
		case err == nil:
			s.unmount = unmount
		case errors.Is(err, diskcap.ErrUnsupported):
			// The run's watchdog enforces the cap, as on the cold path.
		default:
			return fmt.Errorf("cap slot directory: %w", err)
		}
	}
	if err := workspace.CreateRunDirs(dirs, s.owner); err != nil {
		return fmt.Errorf("create slot directory: %w", err)
	}
	return nil
}

// awaitGate accepts the gate's connection and reads its hello.
func (s *Slot) awaitGate(ctx context.Context) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultParkTimeout)
	}
	ul, _ := s.ln.(*net.UnixListener)
	if ul != nil {
		_ = ul.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { s.ln.Close() })
	defer stop()
	conn, err := s.ln.Accept()
	if err != nil {
		return fmt.Errorf("the gate of container %s did not connect: %w", shortID(s.parked.ID()), err)
	}
	s.conn = conn
	// One connection only: nothing else may reach the gate, and the run
	// directory holds nothing of it when the run starts.
	s.ln.Close()
	if err := os.RemoveAll(filepath.Join(s.dir, gateDir)); err != nil {
		return fmt.Errorf("remove the gate's socket: %w", err)
	}
	_ = conn.SetReadDeadline(deadline)
	if err := json.NewDecoder(io.LimitReader(conn, probe.MaxGateMessage)).Decode(&s.hello); err != nil {
		return fmt.Errorf("the gate of container %s sent no report: %w", shortID(s.parked.ID()), err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	return nil
}

// audit checks the parked container as a run's isolation checks do: the
// self-check's report against the expectation, the live container against
// the audit rules. Either failing refuses the slot.
func (p *Pool) audit(ctx context.Context, s *Slot, t Template, expect probe.Expectation) error {
	if bad := expect.Contradictions(s.hello.Report); len(bad) > 0 {
		return fmt.Errorf("%w: the in-sandbox self-check: %s", ErrAudit, strings.Join(bad, "; "))
	}
	posture, err := s.parked.Posture(ctx)
	if err != nil {
		return fmt.Errorf("read container posture: %w", err)
	}
	var host sandbox.HostFacts
	if d, ok := p.cfg.Backend.(sandbox.EngineDescriber); ok {
		if host, err = d.HostFacts(ctx); err != nil {
			return fmt.Errorf("read host facts: %w", err)
		}
	}
	opts := t.Audit
	opts.Mounts.RunDir = s.dir
	if rep := audit.Check(posture, host, opts); rep.Failed() {
		return fmt.Errorf("%w: the container breaks %s", ErrAudit, strings.Join(rep.FailedIDs(), ", "))
	}
	return nil
}

// shortID is the 12-character form of a container ID.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
