package executor

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/probe"
)

// The run index's isolation verdict counts the rules as `taskrun audit`
// does: a rule that was not applicable is not counted as passed, and the
// self-check (TR:probe) is one of the rules.
func TestIsolationVerdictCountsAsAuditDoes(t *testing.T) {
	findings := []audit.Finding{
		{ID: "a", Status: audit.Pass}, {ID: "b", Status: audit.Pass},
		{ID: "c", Status: audit.NotApplicable}, {ID: "d", Status: audit.NotApplicable},
	}
	var table bytes.Buffer
	require.NoError(t, audit.Report{Findings: findings}.WriteTable(&table))
	assert.Contains(t, table.String(), "\n2 passed, 0 failed, 2 not applicable\n")

	verdict := func(r audit.Record) string { return isolationVerdict(&r) }
	assert.Equal(t, "2 passed, 0 failed, 3 not applicable (no in-sandbox self-check)", verdict(audit.Record{Findings: findings}))
	assert.Equal(t, "3 passed, 0 failed, 2 not applicable; the self-check agrees", verdict(audit.Record{Findings: findings, Probe: &probe.Report{}}))
	findings[0].Status = audit.Fail
	assert.Equal(t, "2 passed, 1 failed, 2 not applicable", verdict(audit.Record{Findings: findings, Probe: &probe.Report{}}))
}
