package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testdeadline"
)

// With --warm-budget the daemon's pool keeps what the budget holds, not
// --warm: the default run's limit is 1 GiB of memory, so a 1.5 GiB budget
// holds one parked container of --warm 3.
func TestDaemonWarmBudget(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"), "--warm", "3", "--warm-budget", "1536m", "--memory", "1g")
	parked := func() int {
		out, err := exec.Command("docker", "ps", "-a", "--filter", "label=dev.taskrun.pool",
			"--format", `{{.Label "dev.taskrun.run-dir"}}`).Output()
		require.NoError(t, err)
		n := 0
		for _, dir := range strings.Fields(string(out)) {
			if strings.HasPrefix(dir, e.root+"/") {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return parked() == 1 }, testdeadline.Scale(2*time.Minute), 50*time.Millisecond, "the daemon parks a container: %s", d.log)
	time.Sleep(3 * time.Second) // --warm 3 would go on filling
	assert.Equal(t, 1, parked(), "the budget holds one container")
}

func TestDaemonWarmBudgetFlag(t *testing.T) {
	for _, args := range [][]string{{"--warm-budget", "1g"}, {"--warm", "2", "--warm-budget", "lots"}} {
		o := &daemonOptions{}
		fs := pflag.NewFlagSet("daemon", pflag.ContinueOnError)
		o.define(fs)
		require.NoError(t, fs.Parse(args))
		err := o.finish()
		require.Error(t, err, "%v", args)
		assert.Contains(t, err.Error(), "--warm-budget", "%v", args)
	}
	o := &daemonOptions{}
	fs := pflag.NewFlagSet("daemon", pflag.ContinueOnError)
	o.define(fs)
	require.NoError(t, fs.Parse([]string{"--warm", "2", "--warm-budget", "1g"}))
	require.NoError(t, o.finish())
	assert.Equal(t, int64(1<<30), o.budget)
}
