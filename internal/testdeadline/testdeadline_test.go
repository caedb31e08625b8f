package testdeadline

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTheVariableSetsTheSlowdown(t *testing.T) {
	f, err := factor("2.5", "40.00 30.00 20.00 3/500 1234", 2)
	require.NoError(t, err)
	assert.Equal(t, 2.5, f, "the variable wins over the measured load")

	f, err = factor(" 100 ", "", 2)
	require.NoError(t, err)
	assert.Equal(t, 100.0, f, "the variable is not capped")
}

func TestABadVariableIsAnErrorNamingIt(t *testing.T) {
	for _, v := range []string{"fast", "0.5", "0", "-3", "NaN", "1e9"} {
		_, err := factor(v, "0.10 0.10 0.10 1/100 1", 2)
		require.Error(t, err, v)
		assert.Contains(t, err.Error(), EnvSlowdown, v)
		assert.Contains(t, err.Error(), "at least 1", v)
	}
}

func TestTheLoadPerCPUSetsTheSlowdown(t *testing.T) {
	cases := []struct {
		loadavg string
		cpus    int
		want    float64
	}{
		{"0.50 0.40 0.30 1/100 1", 2, 1},     // idle: deadlines as written
		{"6.00 4.00 2.00 9/300 77", 2, 3},    // 3 runnable per CPU
		{"90.00 80.00 70.00 9/300 77", 2, 8}, // capped
		{"", 2, 1},                           // no /proc/loadavg
		{"garbage", 2, 1},
		{"4.00 1 1 1/1 1", 0, 1},
	}
	for _, c := range cases {
		f, err := factor("", c.loadavg, c.cpus)
		require.NoError(t, err)
		assert.Equal(t, c.want, f, "%q on %d CPUs", c.loadavg, c.cpus)
	}
}

func TestScaleMultipliesByTheVariable(t *testing.T) {
	t.Setenv(EnvSlowdown, "3")
	assert.Equal(t, 3*time.Minute, Scale(time.Minute))
}

func TestScalePanicsOnABadVariable(t *testing.T) {
	t.Setenv(EnvSlowdown, "slow")
	assert.PanicsWithError(t, `TASKRUN_TEST_SLOWDOWN="slow": set it to a number of at least 1 (how many times slower than an idle machine this one is), or unset it to use the measured load`,
		func() { Scale(time.Second) })
}
