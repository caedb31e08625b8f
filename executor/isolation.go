package executor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/probe"
	"github.com/taskrun/taskrun/sandbox"
)

// The in-sandbox self-check.
const (
	// ProbeBinary is the self-check's file name in the helpers directory.
	ProbeBinary = helpers.ProbeName
	// ProbeRefusedExitCode is the self-check's exit status when the sandbox
	// contradicts the policy; the agent never started.
	ProbeRefusedExitCode = 86
)

// ErrIsolation is wrapped when a run is refused because its container is not
// isolated as the policy demands, seen from the host or from inside.
var ErrIsolation = errors.New("isolation check failed")

// isolation is one run's self-check, live audit and what they found.
type isolation struct {
	nonce       string
	expect      probe.Expectation
	interceptor *probe.Interceptor // nil when the self-check does not run
	posture     *audit.Posture
	host        audit.HostFacts
	opts        audit.Options
	// probeReport and contradictions are what the self-check saw.
	probeReport    *probe.Report
	contradictions []string
	// imageDigest names the image the run used (its repo digest, else its
	// ID); empty keeps the posture's image ID.
	imageDigest string
	// holds says the self-check waits for the host's go-ahead (hold): where
	// the container shares the run directory's sockets (not a Kubernetes
	// Pod). hold is the host's side once listening.
	holds bool
	hold  *probe.Hold
}

// newIsolation prepares the checks of a run of p under policy (p's policy
// with the run's own user). The audit pins every helper mount to its host
// file.
func newIsolation(p *plan, policy sandbox.Policy, caps sandbox.Capabilities) *isolation {
	return &isolation{
		nonce:  strings.ToLower(rand.Text()),
		expect: expectation(policy, caps),
		opts:   auditOptions(p, policy),
		holds:  caps.SharesRunDir,
	}
}

// auditOptions are the live audit's options for a run of p under policy.
func auditOptions(p *plan, policy sandbox.Policy) audit.Options {
	return audit.Options{
		Mounts:        audit.MountPolicy{RunDir: p.dirs.Dir, HelperFiles: p.helpers.Sources()},
		RequireGVisor: policy.Runtime == sandbox.RuntimeGVisor,
	}
}

// listenHold opens the run's hold in its run directory, shared with the
// agent's uid, when the self-check holds (a Docker container bind-mounts
// the run directory): the agent then starts only once releaseHold sent the
// go-ahead. A Pod has the run directory copied in, not shared, and starts
// without a hold.
func (iso *isolation) listenHold(p *plan, uid int) error {
	if !iso.holds {
		return nil
	}
	h, err := probe.ListenHold(filepath.Join(p.dirs.Dir, filepath.FromSlash(model.HoldSocketPath)), uid, iso.nonce)
	if err != nil {
		return err
	}
	iso.hold = h
	return nil
}

// releaseHold lets the agent start: it waits for the self-check to ask,
// until ctx ends or the hold is closed. It reports whether the agent got
// the go-ahead (true without a hold).
func (iso *isolation) releaseHold(ctx context.Context) bool {
	if iso.hold == nil {
		return true
	}
	return iso.hold.Release(ctx) == nil
}

// closeHold closes the hold without a go-ahead, if it is still open: a
// self-check still waiting refuses the run.
func (iso *isolation) closeHold() {
	if iso.hold != nil {
		_ = iso.hold.Close()
	}
}

// expectation is what the self-check must observe under policy on a
// backend with caps. gVisor virtualises /proc: it shows no NoNewPrivs
// line, no seccomp filter and no cgroup files inside, and its /proc/sys is
// the sentry's own (no host kernel tunable is reachable), so those are
// checked from the host only. What differs between backends (a Pod's own
// network interface, the pids limit no Pod has, the service account token
// a Pod must not mount) the backend states in its capabilities.
func expectation(p sandbox.Policy, caps sandbox.Capabilities) probe.Expectation {
	e := probe.Expectation{
		NonRoot:               true,
		CapEffZero:            true,
		CapBndZero:            true,
		RootfsReadOnly:        p.ReadOnlyRootfs,
		NetworkNone:           !caps.OwnNetwork && p.NetworkMode == sandbox.NetworkNone,
		SkipEgressProbes:      caps.OwnNetwork,
		NoDockerSocket:        true,
		NoServiceAccountToken: caps.NoServiceAccount,
	}
	if uid, err := strconv.Atoi(strings.SplitN(p.User, ":", 2)[0]); err == nil {
		e.UID = &uid
	}
	for _, t := range caps.Unreachable {
		e.Unreachable = append(e.Unreachable, probe.ReachTarget{Name: t.Name, Host: t.Host, HostEnv: t.HostEnv, Port: t.Port})
	}
	if p.Runtime != sandbox.RuntimeGVisor {
		e.ProcSysReadOnly = true
		e.NoNewPrivs = true
		e.SeccompFilter = true
		e.MemoryLimit = &p.MemoryBytes
		if caps.LimitsPids {
			e.PidsMax = &p.PidsLimit
		}
	}
	return e
}

// auditLive inspects the live container and checks it against the audit
// rules. A failing rule refuses the run: the executor does not trust a
// container it did not get exactly as asked.
func (iso *isolation) auditLive(ctx context.Context, caps sandbox.Capabilities, h sandbox.Handle, host <-chan hostFactsResult) error {
	p, err := h.Posture(ctx)
	if err != nil {
		return fmt.Errorf("read container posture: %w", err)
	}
	iso.posture = &p
	if caps.DescribesHost {
		facts := <-host
		if facts.err != nil {
			return fmt.Errorf("%w: %w", ErrIsolation, facts.err)
		}
		iso.host = facts.facts
	}
	if rep := audit.Check(p, iso.host, iso.opts); rep.Failed() {
		return fmt.Errorf("%w: the container breaks %s", ErrIsolation, strings.Join(rep.FailedIDs(), ", "))
	}
	return nil
}

// hostFactsResult is the engine's answer to HostFacts.
type hostFactsResult struct {
	facts audit.HostFacts
	err   error
}

// prefetchHostFacts asks backend for the engine's host facts in the
// background, once after is closed (at once for a nil after); the channel
// yields the answer once (nothing for a backend that describes no engine).
// The engine answers `docker info` with work of its own, which would slow
// a create it serves beside it: a run created ahead asks once its create
// returned, while the container starts.
func prefetchHostFacts(ctx context.Context, backend sandbox.Backend, caps sandbox.Capabilities, after <-chan struct{}) <-chan hostFactsResult {
	out := make(chan hostFactsResult, 1)
	d, ok := backend.(sandbox.EngineDescriber) // the method of caps.DescribesHost
	if !caps.DescribesHost || !ok {
		return out
	}
	go func() {
		if after != nil {
			select {
			case <-after:
			case <-ctx.Done():
			}
		}
		facts, err := d.HostFacts(ctx)
		out <- hostFactsResult{facts: facts, err: err}
	}()
	return out
}

// readProbe reads the self-check's report after the run and explains a
// refusal.
func (iso *isolation) readProbe(exit sandbox.Result) error {
	if iso.interceptor == nil {
		return nil
	}
	if err := iso.interceptor.Flush(); err != nil {
		return err
	}
	rep, ok := iso.interceptor.Report()
	if !ok {
		if exit.TimedOut || exit.Cancelled {
			return nil
		}
		return fmt.Errorf("%w: the in-sandbox self-check sent no report", ErrIsolation)
	}
	iso.probeReport = rep
	iso.contradictions = iso.expect.Contradictions(*rep)
	if len(iso.contradictions) > 0 {
		return fmt.Errorf("%w: the in-sandbox self-check refused the run: %s", ErrIsolation, strings.Join(iso.contradictions, "; "))
	}
	if c := rep.Command; c != nil {
		return fmt.Errorf("%w: %s: %s; %s (see \"What an agent image needs\" in the README)", sandbox.ErrImageUnusable, c.Command, c.Problem, c.Need)
	}
	return nil
}
