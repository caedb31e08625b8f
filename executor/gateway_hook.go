package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/timings"
	"github.com/taskrun/taskrun/workspace"
)

// gatewayRecordName is the executor-owned copy of the gateway's exchanges
// in the run's host directory.
const gatewayRecordName = "gateway.jsonl"

// gatewayHook is the run's model gateway, when the run has a model:
//
//	Configure  the agent finds the gateway's socket and the model's name
//	           in its environment
//	Prestart   the gateway starts, with the trace and its record
//	Exited     the gateway stops: metered tokens, the upstream's last
//	           failure, and the budget error when the run overspent
//	Collect    the executor-owned record is stored next to the trace
//	           (also from a kept run's copy)
//	Stop       the gateway is stopped, if Exited did not
type gatewayHook struct {
	p     *plan
	gw    *gateway.Gateway
	trace *os.File
	// record is the executor-owned copy of the gateway's exchanges: the
	// shared trace is writable by the agent, this one is not.
	record *os.File
	done   bool
}

func (g *gatewayHook) name() string { return "gateway" }

// configure gives the agent what it needs to reach the run's model.
func (g *gatewayHook) configure(req *configureRequest) {
	if g.p.in.Model.IsZero() {
		return
	}
	req.Spec.Env = append(req.Spec.Env,
		"TASKRUN_MODEL_SOCKET="+model.ContainerRunDir+"/"+model.GatewaySocketPath,
		"TASKRUN_MODEL="+gateway.ModelName(g.p.in.Model),
	)
}

// prestart starts the gateway for the agent's uid. The gateway appends
// every exchange to the run's trace file, which the agent appends to as
// well; the file is created here, before the agent runs, and held open, so
// the agent cannot redirect it.
//
// What the gateway writes to both counts against the run's record budget:
// once it is spent, the gateway's lines are refused (and it writes only
// bodiless ones, which fit or not) and each file ends in a marker line.
func (g *gatewayHook) prestart(ctx context.Context, req *prestartRequest, _ *prestartResponse) error {
	defer g.p.timings.Start(timings.Gateway)()
	p := g.p
	if p.in.Model.IsZero() {
		return nil
	}
	trace, err := workspace.CreateSandboxFile(p.dirs.Global, p.tracePath, req.Owner)
	if err != nil {
		return fmt.Errorf("create trace: %w", err)
	}
	record, err := os.OpenFile(filepath.Join(p.hostDir, gatewayRecordName), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		trace.Close()
		return fmt.Errorf("create gateway record: %w", err)
	}
	gw, err := gateway.Start(ctx, gateway.Config{
		SocketPath: filepath.Join(p.dirs.Dir, filepath.FromSlash(model.GatewaySocketPath)),
		Model:      p.in.Model,
		// The protected record first: a full run dir must not cost it.
		Trace:    io.MultiWriter(req.Records.Writer("gateway record", record), req.Records.Writer("trace", trace)),
		Logger:   p.log,
		AgentUID: req.Owner.UID,
	})
	if err != nil {
		trace.Close()
		record.Close()
		return fmt.Errorf("start model gateway: %w", err)
	}
	g.gw, g.trace, g.record = gw, trace, record
	return nil
}

// exited stops the gateway and reports the metered tokens and, when the
// upstream was misconfigured or down at the last exchange, what it
// answered; the error is the budget error, if the run overspent.
func (g *gatewayHook) exited(_ context.Context, _ *exitedRequest, resp *exitedResponse) error {
	if g.gw == nil {
		return nil
	}
	err := g.finish()
	// Usage, Err and UpstreamErr are final only once Close has returned.
	u := g.gw.Usage()
	resp.PromptTokens, resp.CompletionTokens = ptr(u.PromptTokens), ptr(u.CompletionTokens)
	if upErr := g.gw.UpstreamErr(); upErr != nil {
		resp.ModelUpstream = upErr.Error()
	}
	return errors.Join(g.gw.Err(), err)
}

// finish stops the gateway and closes its files, once.
func (g *gatewayHook) finish() error {
	if g.gw == nil || g.done {
		return nil
	}
	g.done = true
	return errors.Join(g.gw.Close(), g.trace.Close(), g.record.Close())
}

// collect stores the executor-owned record of the model exchanges next to
// the trace, when the run (or the kept run) had a model.
func (g *gatewayHook) collect(ctx context.Context, req *collectRequest, _ *collectResponse) error {
	return req.Global(ctx, gatewayRecordName, g.p.gatewayRecordPath, "application/x-ndjson")
}

// stop stops a gateway the run never got to Exited.
func (g *gatewayHook) stop(context.Context, *stopRequest) {
	if err := g.finish(); err != nil {
		g.p.log.Warn("stop the model gateway", "err", err)
	}
}
