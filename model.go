package taskrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/workspace"
)

// In-container location of the model gateway's socket.
const (
	gatewayDirName         = ".gateway"
	gatewaySocketName      = "model.sock"
	gatewayRecordName      = "gateway.jsonl"
	containerGatewaySocket = containerRunDir + "/" + gatewayDirName + "/" + gatewaySocketName
)

// modelAccess is the run's model gateway and the trace file it appends to.
type modelAccess struct {
	gw    *gateway.Gateway
	trace *os.File
	// record is the executor-owned copy of the gateway's exchanges: the
	// shared trace is writable by the agent, this one is not.
	record *os.File
}

// startModel starts the run's model gateway when a model is configured. The
// gateway appends every exchange to the run's trace file, which the agent
// appends to as well; the file is created here, before the agent runs, and
// held open, so the agent cannot redirect it.
func (r *runner) startModel(ctx context.Context) (*modelAccess, error) {
	if r.in.Model.IsZero() {
		return nil, nil
	}
	trace, err := r.createTrace()
	if err != nil {
		return nil, fmt.Errorf("create trace: %w", err)
	}
	record, err := os.OpenFile(filepath.Join(r.hostDir, gatewayRecordName), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		trace.Close()
		return nil, fmt.Errorf("create gateway record: %w", err)
	}
	gw, err := gateway.Start(ctx, gateway.Config{
		SocketPath: filepath.Join(r.dirs.Dir, gatewayDirName, gatewaySocketName),
		Model:      r.in.Model,
		// The protected record first: a full run dir must not cost it.
		Trace:    io.MultiWriter(record, trace),
		Logger:   r.log,
		AgentUID: workspace.SandboxOwner.UID,
	})
	if err != nil {
		trace.Close()
		record.Close()
		return nil, fmt.Errorf("start model gateway: %w", err)
	}
	return &modelAccess{gw: gw, trace: trace, record: record}, nil
}

// env is what the agent needs to reach the model.
func (m *modelAccess) env() []string {
	if m == nil {
		return nil
	}
	return []string{"TASKRUN_MODEL_SOCKET=" + containerGatewaySocket, "TASKRUN_MODEL=" + m.gw.ModelName()}
}

// finish stops the gateway, records the metered tokens in res and returns the
// budget error, if the run overspent.
func (m *modelAccess) finish(res *RunResult) error {
	if m == nil {
		return nil
	}
	// Usage and Err are final only once Close has returned.
	closeErr := m.gw.Close()
	u := m.gw.Usage()
	res.PromptTokens, res.CompletionTokens = ptr(u.PromptTokens), ptr(u.CompletionTokens)
	return errors.Join(m.gw.Err(), closeErr, m.trace.Close(), m.record.Close())
}

// createTrace creates global/traces/<session>/rt_<run>.jsonl for the sandbox
// user, before the container starts.
func (r *runner) createTrace() (*os.File, error) {
	return workspace.CreateSandboxFile(r.dirs.Global, r.tracePath(), workspace.SandboxOwner)
}

// gatewayRecordPath is the key, in run-global storage, of the executor-owned
// record of the gateway's exchanges, next to the trace.
func (r *runner) gatewayRecordPath() string {
	return path.Join("traces", r.in.SessionID, "gw_"+r.ref.RunID+".jsonl")
}

// tracePath is this run's trace key in run-global storage.
func (r *runner) tracePath() string {
	return path.Join("traces", r.in.SessionID, "rt_"+r.ref.RunID+".jsonl")
}
