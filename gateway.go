package taskrun

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"context"

	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/records"
	"github.com/taskrun/taskrun/workspace"
)

// runGateway is the run's model gateway and the trace file it appends to.
type runGateway struct {
	gw    *gateway.Gateway
	trace *os.File
	// record is the executor-owned copy of the gateway's exchanges: the
	// shared trace is writable by the agent, this one is not.
	record *os.File
}

// startGateway starts the run's model gateway, for the agent's uid, when a
// model is configured; it returns nil otherwise. The gateway appends every exchange to the run's
// trace file, which the agent appends to as well; the file is created here,
// before the agent runs, and held open, so the agent cannot redirect it.
//
// What the gateway writes to both counts against the run's record budget:
// once it is spent, the gateway's lines are refused (and it writes only
// bodiless ones, which fit or not) and each file ends in a marker line.
func startGateway(ctx context.Context, p *plan, agent workspace.Owner, budget *records.Budget) (*runGateway, error) {
	if p.in.Model.IsZero() {
		return nil, nil
	}
	trace, err := workspace.CreateSandboxFile(p.dirs.Global, p.tracePath, agent)
	if err != nil {
		return nil, fmt.Errorf("create trace: %w", err)
	}
	record, err := os.OpenFile(filepath.Join(p.hostDir, gatewayRecordName), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		trace.Close()
		return nil, fmt.Errorf("create gateway record: %w", err)
	}
	gw, err := gateway.Start(ctx, gateway.Config{
		SocketPath: filepath.Join(p.dirs.Dir, filepath.FromSlash(model.GatewaySocketPath)),
		Model:      p.in.Model,
		// The protected record first: a full run dir must not cost it.
		Trace:    io.MultiWriter(budget.Writer("gateway record", record), budget.Writer("trace", trace)),
		Logger:   p.log,
		AgentUID: agent.UID,
	})
	if err != nil {
		trace.Close()
		record.Close()
		return nil, fmt.Errorf("start model gateway: %w", err)
	}
	return &runGateway{gw: gw, trace: trace, record: record}, nil
}

// gatewayEnv is what the agent needs to reach the run's model, when it has
// one: the gateway's socket and the model's name.
func gatewayEnv(p *plan) []string {
	if p.in.Model.IsZero() {
		return nil
	}
	return []string{
		"TASKRUN_MODEL_SOCKET=" + model.ContainerRunDir + "/" + model.GatewaySocketPath,
		"TASKRUN_MODEL=" + gateway.ModelName(p.in.Model),
	}
}

// finish stops the gateway, records the metered tokens in ex (nil when the
// run had no model) and, when the upstream was misconfigured or down at
// the last exchange, what it answered; it returns the budget error, if the
// run overspent.
func (g *runGateway) finish(ex *execution) error {
	if g == nil {
		return nil
	}
	// Usage, Err and UpstreamErr are final only once Close has returned.
	closeErr := g.gw.Close()
	u := g.gw.Usage()
	ex.PromptTokens, ex.CompletionTokens = ptr(u.PromptTokens), ptr(u.CompletionTokens)
	if upErr := g.gw.UpstreamErr(); upErr != nil {
		ex.ModelUpstream = upErr.Error()
	}
	return errors.Join(g.gw.Err(), closeErr, g.trace.Close(), g.record.Close())
}
