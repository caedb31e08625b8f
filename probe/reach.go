package probe

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
)

// ReachTarget is an address the sandbox must not reach, such as its node's
// kubelet or a peer Pod: the self-check connects to it over TCP and a
// connect that succeeds is a contradiction.
type ReachTarget struct {
	// Name says what the target is ("node kubelet", "peer pod").
	Name string `json:"name"`
	// Host is the target's address; HostEnv, when set instead, names the
	// environment variable holding it (a Pod's node address, which only
	// the Downward API knows when the Pod is created).
	Host    string `json:"host,omitempty"`
	HostEnv string `json:"host_env,omitempty"`
	// Port is the TCP port.
	Port int `json:"port"`
}

// probeReach connects to every target, each within cfg.EgressTimeout, in
// parallel. A target whose address is unknown is reported with the reason
// and Reachable false; Contradictions fails it (fail closed).
func probeReach(ctx context.Context, cfg Config, targets []ReachTarget) []Egress {
	out := make([]Egress, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		host := t.Host
		if t.HostEnv != "" {
			host = os.Getenv(t.HostEnv)
		}
		out[i] = Egress{Name: t.Name}
		if host == "" || t.Port <= 0 {
			out[i].Error = fmt.Sprintf("%s: %s", unknownAddress, describeTarget(t))
			continue
		}
		out[i].Target = net.JoinHostPort(host, strconv.Itoa(t.Port))
		wg.Add(1)
		go func(e *Egress) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctx, cfg.EgressTimeout)
			defer cancel()
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", e.Target)
			if err == nil {
				c.Close()
			}
			e.Reachable = err == nil
			if err != nil {
				e.Error = err.Error()
			}
		}(&out[i])
	}
	wg.Wait()
	return out
}

// unknownAddress starts the error of a target whose address the probe could
// not learn.
const unknownAddress = "address unknown"

// describeTarget names where a target's address was to come from.
func describeTarget(t ReachTarget) string {
	if t.HostEnv != "" {
		return fmt.Sprintf("$%s is unset (port %d)", t.HostEnv, t.Port)
	}
	return fmt.Sprintf("no host given (port %d)", t.Port)
}

// reachContradictions lists how the reach results contradict the
// expectation that no target is reachable.
func reachContradictions(targets []ReachTarget, got []Egress) []string {
	var out []string
	if len(got) < len(targets) {
		return []string{fmt.Sprintf("%d of %d reachability probes ran, cannot confirm the sandbox reaches none", len(got), len(targets))}
	}
	for _, e := range got {
		switch {
		case e.Reachable:
			out = append(out, fmt.Sprintf("connected to %s at %s, expected no route from the sandbox", e.Name, e.Target))
		case e.Target == "":
			out = append(out, fmt.Sprintf("could not probe %s: %s", e.Name, e.Error))
		}
	}
	return out
}
