package audit

import (
	"path"
	"slices"

	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/sandbox"
)

// EgressRecord is the egress part of a run's isolation record: the policy
// the run had and what its proxy saw. The policy holds no secret (a
// credential names where its value was read, never the value).
type EgressRecord struct {
	Policy  egress.Policy  `json:"policy"`
	Summary egress.Summary `json:"summary"`
	// Object names the run object holding one line per connection.
	Object string `json:"object"`
}

// checkEgress: a run with an egress policy reaches the network only through
// its proxy, so its container has network none and the proxy's socket lies
// in the mounted run dir. A network mode rule 5.10 already refuses is left
// to 5.10.
func checkEgress(c checkCtx) (Status, string) {
	sock, ok := c.p.Labels[sandbox.LabelEgress]
	if !ok {
		return pass("no egress policy: the run has no proxy and no route out")
	}
	if c.p.NetworkMode != "none" {
		if !slices.Contains(c.opts.AllowedNetworkModes, c.p.NetworkMode) {
			return na("NetworkMode %q is judged by 5.10", c.p.NetworkMode)
		}
		return fail("the run has an egress policy but NetworkMode is %q: its only route out must be the proxy socket, with network none", c.p.NetworkMode)
	}
	sock = path.Clean("/" + sock)
	if !below(sock, RunDirTarget) {
		return fail("egress socket %q is not inside the run dir %s", sock, RunDirTarget)
	}
	if !slices.ContainsFunc(c.p.Mounts, func(m Mount) bool {
		return m.Type == "bind" && path.Clean("/"+m.Destination) == RunDirTarget
	}) {
		return fail("the run dir holding the egress socket %s is not mounted", sock)
	}
	return pass("network none; the only route out is the egress proxy socket %s", sock)
}
