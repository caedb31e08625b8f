package taskrun

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/probe"
	"github.com/taskrun/taskrun/sandbox"
)

// Names of the isolation record and the in-sandbox self-check.
const (
	// AuditRecordName is the run object holding the isolation record.
	AuditRecordName = "audit.json"
	// ProbeBinary is the self-check's file name in the helpers directory.
	ProbeBinary = "taskrun-probe"
	// ProbeRefusedExitCode is the self-check's exit status when the sandbox
	// contradicts the policy; the agent never started.
	ProbeRefusedExitCode = 86
)

// ErrIsolation is wrapped when a run is refused because its container is not
// isolated as the policy demands, seen from the host or from inside.
var ErrIsolation = errors.New("isolation check failed")

// isolation is one run's self-check and isolation record.
type isolation struct {
	nonce       string
	expect      probe.Expectation
	interceptor *probe.Interceptor // nil when the self-check does not run
	posture     *audit.Posture
	host        audit.HostFacts
	opts        audit.Options
}

// newIsolation prepares the checks. The self-check runs when the helpers
// directory holds the static probe; it is mounted read-only and wraps the
// container's command, so the agent starts only after the probe reported.
func (r *runner) newIsolation() *isolation {
	iso := &isolation{
		nonce:  strings.ToLower(rand.Text()),
		expect: expectation(r.policy),
		opts: audit.Options{
			Mounts:        audit.MountPolicy{RunDir: r.dirs.Dir, HelpersDir: r.helpersDir()},
			RequireGVisor: r.policy.Runtime == sandbox.RuntimeGVisor,
		},
	}
	return iso
}

// helpersDir is the helpers directory as mounted, or "" for none.
func (r *runner) helpersDir() string {
	if r.in.HelpersDir == "" {
		return ""
	}
	return filepath.Clean(r.in.HelpersDir)
}

// probePath is the host path of the self-check binary, or "" when the run
// has no helpers directory. A helpers directory without a usable probe is an
// error: the self-check is never skipped silently.
func (r *runner) probePath() (string, error) {
	if r.in.HelpersDir == "" {
		return "", nil
	}
	p := filepath.Join(r.in.HelpersDir, ProbeBinary)
	info, err := os.Stat(p)
	if err == nil && !info.Mode().IsRegular() {
		err = errors.New("not a regular file")
	}
	if err != nil {
		return "", fmt.Errorf("%w: self-check %s: %w; build it with `make build`, or run without a helpers directory", ErrIsolation, p, err)
	}
	return p, nil
}

// apply adds the self-check to spec and returns the stderr writer that
// extracts its report.
func (iso *isolation) apply(spec *sandbox.Spec, helpersDir string, stderr io.Writer) (io.Writer, error) {
	expect, err := json.Marshal(iso.expect)
	if err != nil {
		return nil, err
	}
	spec.Mounts = append(spec.Mounts, sandbox.Mount{Source: helpersDir, Target: audit.HelperTarget, ReadOnly: true})
	spec.Wrapper = []string{audit.HelperTarget + "/" + ProbeBinary, "--nonce", iso.nonce, "--expect", string(expect), "--"}
	iso.interceptor = probe.NewInterceptor(stderr, iso.nonce)
	return iso.interceptor, nil
}

// expectation is what the self-check must observe under policy. gVisor
// virtualises /proc: it shows no NoNewPrivs line, no seccomp filter and no
// cgroup files inside, and its /proc/sys is the sentry's own (no host kernel
// tunable is reachable), so those are checked from the host only.
func expectation(p sandbox.Policy) probe.Expectation {
	e := probe.Expectation{
		NonRoot:        true,
		CapEffZero:     true,
		CapBndZero:     true,
		RootfsReadOnly: p.ReadOnlyRootfs,
		NetworkNone:    p.NetworkMode == sandbox.NetworkNone,
		NoDockerSocket: true,
	}
	if uid, err := strconv.Atoi(strings.SplitN(p.User, ":", 2)[0]); err == nil {
		e.UID = &uid
	}
	if p.Runtime != sandbox.RuntimeGVisor {
		e.ProcSysReadOnly = true
		e.NoNewPrivs = true
		e.SeccompFilter = true
		e.PidsMax = &p.PidsLimit
		e.MemoryLimit = &p.MemoryBytes
	}
	return e
}

// auditLive inspects the live container and checks it against the audit
// rules. A failing rule refuses the run: the executor does not trust a
// container it did not get exactly as asked.
func (r *runner) auditLive(ctx context.Context, iso *isolation, h sandbox.Handle) error {
	raw, err := h.Inspect(ctx)
	if err != nil {
		return fmt.Errorf("inspect container: %w", err)
	}
	p, err := audit.ParseInspect(raw)
	if err != nil {
		return fmt.Errorf("read container posture: %w", err)
	}
	iso.posture = &p
	if d, ok := r.in.Sandbox.(sandbox.EngineDescriber); ok {
		info, err := d.EngineInfo(ctx)
		if err == nil {
			iso.host, err = audit.ParseHostInfo(info)
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrIsolation, err)
		}
	}
	if rep := audit.Check(p, iso.host, iso.opts); rep.Failed() {
		return fmt.Errorf("%w: the container breaks %s", ErrIsolation, strings.Join(rep.FailedIDs(), ", "))
	}
	return nil
}

// probeVerdict reads the self-check's report after the run and explains a
// refusal.
func (iso *isolation) probeVerdict(exit sandbox.Result) (*probe.Report, []string, error) {
	if iso.interceptor == nil {
		return nil, nil, nil
	}
	if err := iso.interceptor.Flush(); err != nil {
		return nil, nil, err
	}
	rep, ok := iso.interceptor.Report()
	if !ok {
		if exit.TimedOut || exit.Cancelled {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("%w: the in-sandbox self-check sent no report", ErrIsolation)
	}
	contradictions := iso.expect.Contradictions(*rep)
	if len(contradictions) > 0 {
		return rep, contradictions, fmt.Errorf("%w: the in-sandbox self-check refused the run: %s", ErrIsolation, strings.Join(contradictions, "; "))
	}
	return rep, nil, nil
}

// isolationRecord is the run's isolation record as JSON, or nil when no
// container was inspected.
func (r *runner) isolationRecord() []byte {
	if r.iso == nil || r.iso.posture == nil {
		return nil
	}
	rec := audit.NewRecord(r.ref.RunID, *r.iso.posture, r.iso.host, r.iso.opts, r.probeReport, r.probeContradictions, time.Now())
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return nil // a Record always marshals
	}
	return data
}
