package audit

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/taskrun/taskrun/sandbox"
)

func egressFinding(p Posture, opts Options) Finding {
	for _, f := range Check(p, fullHost, opts).Findings {
		if f.ID == "TR:egress" {
			return f
		}
	}
	panic("no TR:egress finding")
}

func TestEgressRule(t *testing.T) {
	p := compliant()
	assert.Equal(t, Pass, egressFinding(p, Options{}).Status, "no policy, nothing to check")

	p.Labels[sandbox.LabelEgress] = "/taskrun/.gateway/egress.sock"
	f := egressFinding(p, Options{})
	assert.Equal(t, Pass, f.Status, f.Reason)
	assert.Empty(t, Check(p, fullHost, Options{}).FailedIDs())

	bridged := compliant()
	bridged.Labels[sandbox.LabelEgress] = "/taskrun/.gateway/egress.sock"
	bridged.NetworkMode = "bridge"
	assert.Equal(t, []string{"5.10"}, Check(bridged, fullHost, Options{}).FailedIDs(), "5.10 judges a mode it refuses")
	assert.Equal(t, []string{"TR:egress"}, Check(bridged, fullHost, Options{AllowedNetworkModes: []string{"none", "bridge"}}).FailedIDs(),
		"a run with a policy needs network none even where the deployment allows bridge")

	outside := compliant()
	outside.Labels[sandbox.LabelEgress] = "/tmp/egress.sock"
	assert.Equal(t, []string{"TR:egress"}, Check(outside, fullHost, Options{}).FailedIDs())

	unmounted := compliant()
	unmounted.Labels[sandbox.LabelEgress] = "/taskrun/.gateway/egress.sock"
	unmounted.Mounts = unmounted.Mounts[1:]
	assert.Contains(t, Check(unmounted, fullHost, Options{}).FailedIDs(), "TR:egress")
}
