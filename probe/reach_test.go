package probe

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAReachableTargetIsAContradiction(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	open := ln.Addr().(*net.TCPAddr).Port
	closedLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := closedLn.Addr().(*net.TCPAddr).Port
	require.NoError(t, closedLn.Close())
	t.Setenv("TASKRUN_TEST_NODE", "127.0.0.1")

	targets := []ReachTarget{
		{Name: "node kubelet", HostEnv: "TASKRUN_TEST_NODE", Port: open},
		{Name: "peer pod", Host: "127.0.0.1", Port: closed},
		{Name: "node api", HostEnv: "TASKRUN_TEST_UNSET", Port: 6443},
	}
	exp := Expectation{SkipEgressProbes: true, Unreachable: targets}
	rep := Collect(t.Context(), "n", Config{Reach: targets, SkipEgress: true, WalkRoot: t.TempDir()})
	require.Len(t, rep.Reach, 3)
	assert.True(t, rep.Reach[0].Reachable)
	assert.Equal(t, "127.0.0.1:"+strconv.Itoa(open), rep.Reach[0].Target)
	assert.False(t, rep.Reach[1].Reachable, "nothing listens there")
	assert.NotEmpty(t, rep.Reach[1].Error)
	assert.Empty(t, rep.Reach[2].Target)

	bad := exp.Contradictions(rep)
	assert.Contains(t, bad, "connected to node kubelet at 127.0.0.1:"+strconv.Itoa(open)+", expected no route from the sandbox")
	assert.Contains(t, bad, "could not probe node api: address unknown: $TASKRUN_TEST_UNSET is unset (port 6443)", "an unknown address fails closed")
	for _, b := range bad {
		assert.NotContains(t, b, "peer pod", "a refused connect is no route")
	}

	rep.Reach = nil
	assert.Contains(t, exp.Contradictions(rep), "0 of 3 reachability probes ran, cannot confirm the sandbox reaches none")
}
