package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The gate is the self-check parked ahead of its run (package warmpool): a
// container of a warm pool starts "taskrun-probe --gate SOCKET", which
// connects to the host's unix socket SOCKET in the container's own run dir,
// sends a GateHello with what it observed, and waits. When a run claims the
// container the host sends one GateClaim (the run's self-check arguments and
// environment) and closes the connection; the gate then does what
// taskrun-probe does for a cold run: it observes the sandbox again
// (reusing only its egress attempts and its walk of the read-only root for
// sockets from when it parked, see Config.Parked), writes its report line (with the run's nonce) to stderr, refuses on a
// contradiction, else replaces itself with the run's command. The
// connection never reaches the agent: it is closed (and close-on-exec)
// before the command starts, and the host removes the socket.

// GateFlag is the argument that starts the self-check as a gate.
const GateFlag = "--gate"

// MaxGateMessage bounds each message of the gate protocol.
const MaxGateMessage = 1 << 20

// gateDialTimeout bounds connecting to the host's socket.
const gateDialTimeout = 10 * time.Second

// GateHello is the gate's message when it parks: what it observed.
type GateHello struct {
	Report Report `json:"report"`
}

// GateClaim is the host's message that releases the gate.
type GateClaim struct {
	// Argv is the self-check's command line as a cold run has it:
	// taskrun-probe --nonce N --expect JSON -- CMD ARGS... (argv[0] is not
	// run; the gate is the self-check).
	Argv []string `json:"argv"`
	// Env is the run's environment, NAME=VALUE, over the container's own
	// (the image's): a later entry of a name wins, as in the engine.
	Env []string `json:"env"`
}

// gateMain parks at the socket and, once claimed, runs the self-check as
// Main does.
func gateMain(sock string) int {
	claim, parked, err := awaitClaim(context.Background(), sock, Config{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "taskrun-probe: gate: %v\n", err)
		return exitUsage
	}
	env := mergeEnv(os.Environ(), claim.Env)
	os.Clearenv()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	return mainWith(claim.Argv[1:], Config{Parked: &parked})
}

// awaitClaim connects to sock, reports what it sees and waits for the claim.
// It returns the claim and what it observed.
func awaitClaim(ctx context.Context, sock string, cfg Config) (GateClaim, Report, error) {
	var conn net.Conn
	var err error
	deadline := time.Now().Add(gateDialTimeout)
	for {
		conn, err = net.Dial("unix", sock)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return GateClaim{}, Report{}, err
	}
	defer conn.Close()
	hello := GateHello{Report: Collect(ctx, "gate", cfg)}
	if err := json.NewEncoder(conn).Encode(hello); err != nil {
		return GateClaim{}, Report{}, fmt.Errorf("send hello: %w", err)
	}
	var claim GateClaim
	if err := json.NewDecoder(io.LimitReader(conn, MaxGateMessage)).Decode(&claim); err != nil {
		return GateClaim{}, Report{}, fmt.Errorf("no claim: %w", err)
	}
	if len(claim.Argv) < 2 {
		return GateClaim{}, Report{}, fmt.Errorf("claim without a self-check command line")
	}
	// Best effort: the host removes them too.
	_ = os.Remove(sock)
	_ = os.Remove(filepath.Dir(sock))
	return claim, hello.Report, nil
}

// mergeEnv overlays env on base by name, keeping base's order for the names
// it has and appending the new ones.
func mergeEnv(base, env []string) []string {
	out := make([]string, 0, len(base)+len(env))
	idx := map[string]int{}
	for _, list := range [][]string{base, env} {
		for _, kv := range list {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := idx[k]; ok {
				out[i] = kv
				continue
			}
			idx[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}
