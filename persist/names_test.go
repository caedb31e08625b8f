package persist_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/taskrun/taskrun/persist"
)

// A run's agent cannot store a file under another run's trace or any run's
// gateway record name; its own trace and other files pass.
func TestCheckAgentGlobalPath(t *testing.T) {
	for _, p := range []string{
		"traces/s1/rt_run2.jsonl",
		"traces/s1/notes.jsonl",
		"traces/s1/rt_run1.json",
		"traces/s1/sub/rt_run2.jsonl",
		"memory/gw_run1.jsonl",
		"rt_run1.jsonl",
	} {
		assert.NoError(t, persist.CheckAgentGlobalPath("run2", p), p)
	}
	for _, p := range []string{
		"traces/s1/rt_run1.jsonl",
		"traces/s1/gw_run1.jsonl",
		"traces/s1/gw_run2.jsonl",
		"traces/other/rt_run1.jsonl",
		"traces/s1/deep/dir/gw_x.jsonl",
	} {
		assert.ErrorIs(t, persist.CheckAgentGlobalPath("run2", p), persist.ErrReservedName, p)
	}
	for _, p := range []string{"traces/s1/\u202egnp.jsonl", "traces/s1/x.attrs", "", "traces/../x"} {
		assert.ErrorIs(t, persist.CheckAgentGlobalPath("run2", p), persist.ErrInvalidName, p)
	}
	assert.ErrorIs(t, persist.CheckAgentGlobalPath("bad/run", "traces/s1/x"), persist.ErrInvalidName)
}
