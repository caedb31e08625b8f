package docker

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/sandbox"
)

func TestLimitHitReadsFailcntAndOOMKills(t *testing.T) {
	write := func(dir, name, content string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	calm := t.TempDir()
	write(calm, "memory.failcnt", "0\n")
	write(calm, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
	assert.False(t, limitHit(calm))

	full := t.TempDir()
	write(full, "memory.failcnt", "12\n")
	assert.True(t, limitHit(full))

	killed := t.TempDir()
	write(killed, "memory.failcnt", "0\n")
	write(killed, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
	assert.True(t, limitHit(killed))
}

// Only a SIGKILL the backend did not send, after the cgroup hit its limit,
// counts as an OOM kill the engine missed.
func TestOOMInferred(t *testing.T) {
	assert.True(t, oomInferred(&sandbox.Result{ExitCode: 137}, true))
	assert.False(t, oomInferred(&sandbox.Result{ExitCode: 137}, false), "no sign of the limit")
	assert.False(t, oomInferred(&sandbox.Result{ExitCode: 1}, true), "not killed")
	assert.False(t, oomInferred(&sandbox.Result{ExitCode: 137, TimedOut: true}, true), "the backend stopped it")
	assert.False(t, oomInferred(&sandbox.Result{ExitCode: 137, Cancelled: true}, true), "the backend stopped it")
}
