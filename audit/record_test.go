package audit

import (
	"bytes"
	"encoding/json"
	"strings"
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

// TestOneCountEverywhere: the run index's verdict (inspect, the web
// interface's header), the recorded report and taskrun audit --record's
// re-check (the web interface's table) count the same rules, the
// self-check's included, for a run that passed, one with a failing rule,
// one without a self-check and one whose self-check contradicted the host.
func TestOneCountEverywhere(t *testing.T) {
	pr := &probe.Report{Nonce: "n", UID: 10001, Seccomp: 2, PidsMax: 256}
	failing := compliant()
	failing.Privileged = true
	for name, rec := range map[string]Record{
		"passed":        NewRecord("run-1", compliant(), fullHost, Options{}, pr, nil, time.Now()),
		"failing rule":  NewRecord("run-1", failing, fullHost, Options{}, pr, nil, time.Now()),
		"no self-check": NewRecord("run-1", compliant(), fullHost, Options{}, nil, nil, time.Now()),
		"contradiction": NewRecord("run-1", compliant(), fullHost, Options{}, pr, []string{"pids.max is 512"}, time.Now()),
	} {
		t.Run(name, func(t *testing.T) {
			recorded, today := rec.Report(), rec.Recheck()
			require.Len(t, recorded.Findings, len(RuleIDs())+1, "every rule and the self-check")
			assert.Equal(t, TallyLine(today.Findings), TallyLine(recorded.Findings))
			var table bytes.Buffer
			require.NoError(t, today.WriteTable(&table))
			assert.Contains(t, table.String(), "\n"+TallyLine(recorded.Findings)+"\n", "taskrun audit --record")
			if len(rec.ProbeContradictions) == 0 {
				assert.True(t, strings.HasPrefix(rec.Verdict(), TallyLine(recorded.Findings)), "the run index's verdict %q", rec.Verdict())
			}
			pass, fail, na := today.Counts()
			assert.Equal(t, len(RuleIDs())+1, pass+fail+na)
		})
	}
}
