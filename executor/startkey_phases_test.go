package executor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// A run has one start time: the journal record recovery works from holds
// the very time the RUNNING index record is keyed by, so that a run whose
// executor died is indexed FAILED in place of its RUNNING record, never
// beside it.
func TestPhasesJournalAndIndexShareTheStartTime(t *testing.T) {
	u := newUnit(t)
	var (
		running *runindex.Record
		rec     *journal.Record
		loadErr error
	)
	in := u.input("start1", func(ctx context.Context, p *sandboxfake.Process) int {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if r, err := runindex.Find(ctx, u.store, "start1", "user1"); err == nil {
				running = r
				break
			}
		}
		jd, err := executor.OpenRunJournal(u.root)
		if err != nil {
			loadErr = err
			return 1
		}
		rec, loadErr = jd.Load("start1")
		return 0
	})
	_, err := executor.Execute(context.Background(), in)
	require.NoError(t, err)
	require.NoError(t, loadErr)
	require.NotNil(t, rec)
	require.NotNil(t, running, "a RUNNING record is in the index while the agent runs")

	assert.True(t, rec.StartedAt.Equal(running.Start), "journal start %s, index start %s", rec.StartedAt, running.Start)
	journalKey, err := persist.IndexKey(running.Ref(), rec.StartedAt)
	require.NoError(t, err)
	runningKey, err := persist.IndexKey(running.Ref(), running.Start)
	require.NoError(t, err)
	assert.Equal(t, runningKey, journalKey, "recovery would index the run under another key")
}
