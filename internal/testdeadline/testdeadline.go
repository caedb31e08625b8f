// Package testdeadline scales the deadlines tests wait with to the speed of
// the machine they run on.
//
// A test waits on events, not on time; its deadline only says when to stop
// waiting for an event that is not coming. Such a deadline is written for
// an idle machine of the kind CI runs on (2 cores) and passed through Scale,
// which multiplies it by the machine's slowdown:
//
//   - TASKRUN_TEST_SLOWDOWN, a number ≥ 1, when it is set (e.g. 4 on a
//     machine shared with other work, or under a debugger);
//   - else the load measured when the wait begins: the 1-minute load average
//     per CPU, at least 1 and at most MaxMeasured.
//
// Deadlines that do not depend on the machine's speed (a protocol's timer,
// a limit the test checks is enforced) are not scaled.
package testdeadline

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// EnvSlowdown names the environment variable that sets the slowdown.
const EnvSlowdown = "TASKRUN_TEST_SLOWDOWN"

// MaxMeasured caps the slowdown measured from the load average: beyond it a
// test would rather fail, naming its deadline, than outlast go test's own
// -timeout. TASKRUN_TEST_SLOWDOWN is not capped.
const MaxMeasured = 8.0

// loadavgPath is where the kernel reports the load average.
const loadavgPath = "/proc/loadavg"

// Scale returns d multiplied by the machine's slowdown (see the package
// documentation). It panics when TASKRUN_TEST_SLOWDOWN is set but is not a
// number ≥ 1, naming the variable: a test cannot run with a wrong deadline.
func Scale(d time.Duration) time.Duration {
	f, err := Factor()
	if err != nil {
		panic(err)
	}
	return time.Duration(float64(d) * f)
}

// Factor is the machine's slowdown now: TASKRUN_TEST_SLOWDOWN, or the
// measured load per CPU (1 when it cannot be read).
func Factor() (float64, error) {
	loadavg, _ := os.ReadFile(loadavgPath)
	return factor(os.Getenv(EnvSlowdown), string(loadavg), runtime.NumCPU())
}

// factor computes the slowdown from the variable's value, the contents of
// /proc/loadavg and the number of CPUs.
func factor(env, loadavg string, cpus int) (float64, error) {
	if env = strings.TrimSpace(env); env != "" {
		f, err := strconv.ParseFloat(env, 64)
		if err != nil || f < 1 || math.IsNaN(f) || f > 1e6 {
			return 0, fmt.Errorf("%s=%q: set it to a number of at least 1 (how many times slower than an idle machine this one is), or unset it to use the measured load", EnvSlowdown, env)
		}
		return f, nil
	}
	fields := strings.Fields(loadavg)
	if len(fields) == 0 || cpus < 1 {
		return 1, nil
	}
	load, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return 1, nil
	}
	return min(max(load/float64(cpus), 1), MaxMeasured), nil
}
