package taskrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/records"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workspace"
)

// RelayBinary is the loopback relay's file name in the helpers directory;
// a run with an egress policy runs its command behind it.
const RelayBinary = helpers.RelayName

// egressDir is the directory, relative to the run dir, that holds the
// egress proxy's socket and CA next to the model gateway's socket.
var egressDir = path.Dir(model.GatewaySocketPath)

// runEgress is the run's egress proxy and its executor-owned record.
type runEgress struct {
	px     *egress.Proxy
	record *os.File
	policy egress.Policy
	done   bool
	err    error
}

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

// startEgress starts the run's egress proxy when the run has a policy; it
// returns nil otherwise, and the run keeps no route out. Its record counts
// against the run's record budget: once that is spent, later connections
// are left out and the record ends in a marker line.
func startEgress(ctx context.Context, p *plan, agent workspace.Owner, budget *records.Budget) (*runEgress, error) {
	if p.in.Egress.IsZero() {
		return nil, nil
	}
	record, err := os.OpenFile(filepath.Join(p.hostDir, egress.RecordName), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create egress record: %w", err)
	}
	px, err := egress.Start(ctx, egress.Config{
		SocketPath: filepath.Join(p.dirs.Dir, filepath.FromSlash(egressDir), egress.SocketName),
		Policy:     p.in.Egress,
		Record:     budget.Writer("egress record", record),
		Logger:     p.log,
		AgentUID:   agent.UID,
	})
	if err != nil {
		record.Close()
		return nil, fmt.Errorf("start egress proxy: %w", err)
	}
	return &runEgress{px: px, record: record, policy: p.in.Egress}, nil
}

// apply routes the container through the proxy: the environment points at
// the relay that runs the command (wrapRelay), and a label tells the audit
// the run has a policy.
func (e *runEgress) apply(spec *sandbox.Spec) {
	if e == nil {
		return
	}
	dir := model.ContainerRunDir + "/" + egressDir
	spec.Env = append(spec.Env, e.px.ContainerEnv(dir)...)
	spec.Labels[sandbox.LabelEgress] = egressSocketLabel()
}

// egressSocketLabel is the sandbox.LabelEgress value of a run with an
// egress policy: the proxy socket's path inside the container.
func egressSocketLabel() string {
	return model.ContainerRunDir + "/" + egressDir + "/" + egress.SocketName
}

// finish stops the proxy once; after it, the record is complete. A spent
// egress budget only ends the run's traffic (the agent was told with each
// 403), a spent record budget only shortens the record; any other record
// failure fails the run.
func (e *runEgress) finish() error {
	if e == nil || e.done {
		return nil
	}
	e.done = true
	closeErr := e.px.Close()
	if errors.Is(closeErr, records.ErrExhausted) {
		closeErr = nil // counted with the run's dropped record bytes
	}
	e.err = errors.Join(closeErr, e.record.Close())
	return e.err
}

// auditRecord is the egress part of the isolation record; call finish first.
func (e *runEgress) auditRecord(log *slog.Logger) *audit.EgressRecord {
	if e == nil {
		return nil
	}
	s := e.px.Summary()
	if s.BudgetExceeded != "" {
		log.Warn("egress budget spent; later connections were refused", "reason", s.BudgetExceeded)
	}
	return &audit.EgressRecord{Policy: e.policy, Summary: s, Object: egress.RecordName}
}
