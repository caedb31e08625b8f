package audit

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/taskrun/taskrun/probe"
)

func TestRecordRoundTripAndRecheck(t *testing.T) {
	p := compliant()
	pr := &probe.Report{Nonce: "n", UID: 10001, Seccomp: 2, PidsMax: 256}
	rec := NewRecord("run-1", p, fullHost, Options{}, pr, nil, time.Unix(1700000000, 0))
	assert.Equal(t, p.ID, rec.ContainerID)
	assert.Len(t, rec.Findings, len(RuleIDs()))

	raw, err := json.Marshal(rec)
	require.NoError(t, err)
	back, err := ParseRecord(raw)
	require.NoError(t, err)
	assert.Equal(t, rec, back)

	rep := back.Recheck()
	assert.False(t, rep.Failed())
	assert.Equal(t, Pass, findingByID(t, rep, "TR:probe").Status)

	// A tampered posture fails the recheck, whatever the stored findings say.
	back.Posture.Privileged = true
	assert.Contains(t, back.Recheck().FailedIDs(), "5.5")

	withContradiction := NewRecord("run-1", p, fullHost, Options{}, pr, []string{"pids.max is 512, expected 256"}, time.Now())
	assert.Equal(t, []string{"TR:probe"}, withContradiction.Recheck().FailedIDs())

	noProbe := NewRecord("run-1", p, fullHost, Options{}, nil, nil, time.Now())
	assert.Equal(t, NotApplicable, findingByID(t, noProbe.Recheck(), "TR:probe").Status)

	_, err = ParseRecord([]byte(`{"version":99}`))
	assert.Error(t, err)
}
