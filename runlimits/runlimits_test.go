package runlimits_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/workerclient"
)

func TestCheckRefusesEachLimitOverItsMaximum(t *testing.T) {
	m := runlimits.Maxima{Timeout: time.Hour, MemoryBytes: 2 << 30, CPUs: 2, PIDs: 512, DiskBytes: 4 << 30, MaxOutputBytes: 1 << 30}
	for name, c := range map[string]struct {
		l    workerclient.Limits
		want string
	}{
		"timeout": {workerclient.Limits{TimeoutMillis: 3600001}, "limits.timeout_ms 3600001 is over the maximum 3600000"},
		"memory":  {workerclient.Limits{MemoryBytes: 2<<30 + 1}, "--max-run-memory"},
		"cpus":    {workerclient.Limits{CPUs: 2.5}, "limits.cpus 2.5 is over the maximum 2"},
		"pids":    {workerclient.Limits{PIDs: 100000}, "limits.pids 100000 is over the maximum 512: ask for at most that (the operator sets it with --max-run-pids)"},
		"disk":    {workerclient.Limits{DiskBytes: 5 << 30}, "--max-run-disk"},
		"output":  {workerclient.Limits{MaxOutputBytes: 2 << 30}, "--max-run-output"},
	} {
		t.Run(name, func(t *testing.T) {
			err := m.Check(c.l)
			require.ErrorIs(t, err, runlimits.ErrOverMaximum)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	assert.NoError(t, m.Check(workerclient.Limits{TimeoutMillis: 3600000, MemoryBytes: 2 << 30, CPUs: 2, PIDs: 512, DiskBytes: 4 << 30, MaxOutputBytes: 1 << 30}), "a limit at its maximum passes")
	assert.NoError(t, m.Check(workerclient.Limits{}), "no limits ask for the host's defaults")
}

func TestZeroMaximaAreTheDefaults(t *testing.T) {
	err := runlimits.Maxima{}.Check(workerclient.Limits{PIDs: 100000})
	require.ErrorIs(t, err, runlimits.ErrOverMaximum)
	assert.Contains(t, err.Error(), "over the maximum 4096")
	assert.Equal(t, runlimits.Default, runlimits.Maxima{}.WithDefaults())
}

func TestCheckDefaultsRefusesADefaultOverItsMaximum(t *testing.T) {
	err := runlimits.Maxima{PIDs: 100}.CheckDefaults(runlimits.Maxima{PIDs: 256})
	require.ErrorIs(t, err, runlimits.ErrOverMaximum)
	assert.Contains(t, err.Error(), "--max-run-pids")
	assert.NoError(t, runlimits.Maxima{}.CheckDefaults(runlimits.Maxima{PIDs: 256, MemoryBytes: 1 << 30, CPUs: 1, Timeout: 30 * time.Minute}))
}
