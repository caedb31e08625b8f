package executor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// judgingReaper asks the recovery's gone function about executors, as the
// Kubernetes reaper does for each Pod.
type judgingReaper struct {
	ask     map[string][2]string // name: executor ID and process record
	answers map[string]bool
}

func (r *judgingReaper) ReapGone(_ context.Context, gone func(id, process string) (bool, string)) error {
	r.answers = map[string]bool{}
	for name, q := range r.ask {
		r.answers[name], _ = gone(q[0], q[1])
	}
	return nil
}

// On a backend other than Docker, the start-up recovery hands the reaper a
// judgement by lock and process record: an executor holding its lock is
// alive; one whose lock file is gone is gone when its process record says
// its process exited, and never proven gone without a record.
func TestRecoverJudgesSandboxOwnersByLockAndProcessRecord(t *testing.T) {
	r := &judgingReaper{}
	h, err := executor.New(context.Background(), executor.Config{Root: t.TempDir(), Backend: sandboxfake.New(), Reaper: r, Logger: discard})
	require.NoError(t, err)
	live, err := h.Layout().StartInstance()
	require.NoError(t, err)
	defer live.Close()
	exited := exec.Command("true")
	require.NoError(t, exited.Run())
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	require.NoError(t, err)
	deadRecord := fmt.Sprintf("%d/1/%s", exited.Process.Pid, strings.TrimSpace(string(boot)))

	r.ask = map[string][2]string{
		"live":               {live.ID(), live.Info().Process()},
		"exited":             {instance.NewID(), deadRecord},
		"unknown, no record": {instance.NewID(), ""},
	}
	h.Recover(context.Background())
	assert.Equal(t, map[string]bool{"live": false, "exited": true, "unknown, no record": false}, r.answers)
}
