package executor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/records"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// RelayBinary is the loopback relay's file name in the helpers directory;
// a run with an egress policy runs its command behind it.
const RelayBinary = helpers.RelayName

// egressDir is the directory, relative to the run dir, that holds the
// egress proxy's socket and CA next to the model gateway's socket.
var egressDir = path.Dir(model.GatewaySocketPath)

// egressHook is the run's egress proxy and its executor-owned record, for
// a run with an egress policy:
//
//	plan       checkEgress refuses a policy the run cannot honor
//	Prestart   the proxy starts, with its record (above the create point:
//	           the container's routing names the CA the proxy makes)
//	Configure  the container's environment points at the relay, and a
//	           label tells the audit the run has a policy
//	Exited     the proxy stops; its totals go to the isolation record
//	Collect    the record is stored (also from a kept run's copy)
//	Stop       the proxy is stopped, if Exited did not
type egressHook struct {
	p      *plan
	px     *egress.Proxy
	record *os.File
	done   bool
}

func (e *egressHook) name() string { return "egress" }

// checkEgress refuses an egress policy the run cannot honor: a bad policy, a
// network mode other than none, or no relay among the helpers.
func (p *plan) checkEgress() error {
	pol := p.in.Egress
	if pol.IsZero() {
		return nil
	}
	if err := pol.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	if p.policy.NetworkMode != sandbox.NetworkNone {
		return fmt.Errorf("%w: an egress policy needs network mode %q (the proxy is the only way out), not %q", ErrInvalidInput, sandbox.NetworkNone, p.policy.NetworkMode)
	}
	if _, ok := p.helpers[helpers.RelayName]; !ok {
		return fmt.Errorf("%w: an egress policy needs the relay (%s) among the helpers: use the taskrun binary itself (--helpers-dir self) or a helpers dir that has it (`make build`)", ErrInvalidInput, RelayBinary)
	}
	return nil
}

// prestart starts the proxy. Its record counts against the run's record
// budget: once that is spent, later connections are left out and the
// record ends in a marker line.
func (e *egressHook) prestart(ctx context.Context, req *prestartRequest, _ *prestartResponse) error {
	defer e.p.timings.Start(timings.Egress)()
	p := e.p
	record, err := os.OpenFile(filepath.Join(p.hostDir, egress.RecordName), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("create egress record: %w", err)
	}
	px, err := egress.Start(ctx, egress.Config{
		SocketPath:    filepath.Join(p.dirs.Dir, filepath.FromSlash(egressDir), egress.SocketName),
		Policy:        p.in.Egress,
		Record:        req.Records.Writer("egress record", record),
		Logger:        p.log,
		AgentUID:      req.Owner.UID,
		UpstreamRoots: p.in.EgressRoots,
	})
	if err != nil {
		record.Close()
		return fmt.Errorf("start egress proxy: %w", err)
	}
	e.px, e.record = px, record
	return nil
}

// configure routes the container through the proxy: the environment points
// at the relay that runs the command (wrapRelay), and a label tells the
// audit the run has a policy.
func (e *egressHook) configure(req *configureRequest) {
	if e.px == nil {
		return
	}
	dir := model.ContainerRunDir + "/" + egressDir
	req.Spec.Env = append(req.Spec.Env, e.px.ContainerEnv(dir)...)
	req.Spec.Labels[sandbox.LabelEgress] = egressSocketLabel()
}

// egressLabels adds the egress label to a warm pool key's labels when the
// run has a policy: a slot is created before any proxy runs.
func egressLabels(p *plan, labels map[string]string) map[string]string {
	labels = maps.Clone(labels)
	if !p.in.Egress.IsZero() {
		labels[sandbox.LabelEgress] = egressSocketLabel()
	}
	return labels
}

// egressSocketLabel is the sandbox.LabelEgress value of a run with an
// egress policy: the proxy socket's path inside the container.
func egressSocketLabel() string {
	return model.ContainerRunDir + "/" + egressDir + "/" + egress.SocketName
}

// exited stops the proxy, so the record holds its totals, and reports them
// for the isolation record.
func (e *egressHook) exited(_ context.Context, _ *exitedRequest, resp *exitedResponse) error {
	if e.px == nil {
		return nil
	}
	err := e.finish()
	s := e.px.Summary()
	if s.BudgetExceeded != "" {
		e.p.log.Warn("egress budget spent; later connections were refused", "reason", s.BudgetExceeded)
	}
	resp.Egress = &audit.EgressRecord{Policy: e.p.in.Egress, Summary: s, Object: egress.RecordName}
	return err
}

// finish stops the proxy once; after it, the record is complete. A spent
// egress budget only ends the run's traffic (the agent was told with each
// 403), a spent record budget only shortens the record; any other record
// failure fails the run.
func (e *egressHook) finish() error {
	if e.px == nil || e.done {
		return nil
	}
	e.done = true
	closeErr := e.px.Close()
	if errors.Is(closeErr, records.ErrExhausted) {
		closeErr = nil // counted with the run's dropped record bytes
	}
	return errors.Join(closeErr, e.record.Close())
}

// collect stores the proxy's record, when the run (or the kept run) has one.
func (e *egressHook) collect(ctx context.Context, req *collectRequest, _ *collectResponse) error {
	return req.Kept(ctx, egress.RecordName, egress.RecordName, "application/x-ndjson")
}

// stop stops a proxy the run never got to Exited.
func (e *egressHook) stop(context.Context, *stopRequest) {
	if err := e.finish(); err != nil {
		e.p.log.Warn("stop the egress proxy", "err", err)
	}
}
