package abuse_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
)

// unreachable is how a connection attempt fails when the sandbox has no
// route out: ENETUNREACH under runc, EHOSTUNREACH under gVisor's netstack.
// A timeout would mean packets left the sandbox and went unanswered.
var unreachable = regexp.MustCompile(`Network is unreachable|No route to host`)

const egressScript = `
echo "== netdev"; cat /proc/net/dev
echo "== tcp"; nc -w 3 1.1.1.1 80 </dev/null 2>&1; echo "exit $?"
echo "== tcp443"; nc -w 3 1.1.1.1 443 </dev/null 2>&1; echo "exit $?"
echo "== metadata"; nc -w 3 169.254.169.254 80 </dev/null 2>&1; echo "exit $?"
echo "== dns"; nslookup example.com 2>&1; echo "exit $?"
echo "== dns-direct"; nslookup example.com 1.1.1.1 2>&1; echo "exit $?"
echo "== end"
`

// TCP to an IP, the cloud metadata address and DNS all fail at once with
// "unreachable", because the sandbox has no interface but loopback; the
// self-check recorded the same.
//
// Protection: NetworkMode "none" (Policy.NetworkMode). With a network the
// sandbox has an eth0 and the attempts are routed out.
func TestEgressIsUnreachable(t *testing.T) {
	t.Parallel()
	for _, rt := range runtimes {
		for _, sp := range startPaths {
			t.Run(rt.name+"/"+sp.name, func(t *testing.T) {
				t.Parallel()
				h := newHarnessOn(t, sp.warm)
				h.requireRuntime(t, rt.runtime)
				in, _ := h.input(t, "egress", egressScript)
				in.Policy.Runtime = rt.runtime

				out, err := h.execute(in)
				require.NoError(t, err)
				assert.Equal(t, model.StatusSucceeded, out.Status)
				stdout := out.Result.OutputStr
				require.Contains(t, stdout, "== end", "the script ran to the end")
				assert.Equal(t, []string{"lo"}, interfaces(section(stdout, "netdev")), "the sandbox has only loopback")
				for _, step := range []string{"tcp", "tcp443", "metadata", "dns", "dns-direct"} {
					got := section(stdout, step)
					assert.Regexp(t, unreachable, got, "%s: %q", step, got)
					assert.Contains(t, got, "exit 1", "%s failed", step)
					assert.NotContains(t, strings.ToLower(got), "timed out", step)
				}

				rec := h.record(t, "egress")
				require.NotNil(t, rec.Probe, "the self-check reported")
				assert.Empty(t, rec.Probe.Interfaces)
				require.NotEmpty(t, rec.Probe.Egress)
				for _, e := range rec.Probe.Egress {
					assert.False(t, e.Reachable, "self-check egress %s to %s", e.Name, e.Target)
				}
			})
		}
	}
}

// interfaces lists the interface names of a /proc/net/dev dump.
func interfaces(netdev string) []string {
	var names []string
	for line := range strings.Lines(netdev) {
		name, _, ok := strings.Cut(line, ":")
		if ok && !strings.Contains(name, "|") {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names
}

// No Docker socket is reachable inside: the usual paths do not exist, and the
// self-check's complete walk of the filesystem (every mount target, then /
// outside the agent's own run dir) found none that answers Docker's GET
// /info. The host-side audit of the container passed, including CIS 5.31
// (docker.sock mounted).
//
// Protection: only the run directory (and the read-only helpers) is mounted.
// Mounting the engine's socket makes the self-check refuse the run and the
// audit fail.
func TestDockerSocketIsAbsent(t *testing.T) {
	t.Parallel()
	for _, rt := range runtimes {
		for _, sp := range startPaths {
			t.Run(rt.name+"/"+sp.name, func(t *testing.T) {
				t.Parallel()
				h := newHarnessOn(t, sp.warm)
				h.requireRuntime(t, rt.runtime)
				in, _ := h.input(t, "nosock", `ls -la /var/run/docker.sock /run/docker.sock 2>&1; echo "exit $?"`)
				in.Policy.Runtime = rt.runtime

				out, err := h.execute(in)
				require.NoError(t, err)
				assert.Equal(t, model.StatusSucceeded, out.Status)
				assert.Contains(t, out.Result.OutputStr, "/var/run/docker.sock: No such file or directory")
				assert.Contains(t, out.Result.OutputStr, "/run/docker.sock: No such file or directory")
				assert.Contains(t, out.Result.OutputStr, "exit 1")

				rec := h.record(t, "nosock")
				require.NotNil(t, rec.Probe, "the self-check reported")
				assert.True(t, rec.Probe.SocketSearchComplete, "the socket walk finished: nothing was left unsearched")
				assert.Empty(t, rec.Probe.DockerSockets, "a socket inside answers Docker's GET /info")
				assert.Empty(t, rec.ProbeContradictions)
				for _, f := range rec.Findings {
					assert.NotEqual(t, audit.Fail, f.Status, "audit rule %s: %s", f.ID, f.Reason)
				}
			})
		}
	}
}

// Writing the kernel's core_pattern from inside fails because /proc/sys is
// mounted read-only (EROFS, not just EACCES), and the host's value is
// unchanged.
//
// Protection: the engine's default read-only /proc/sys (the container is
// never privileged and keeps the default ReadonlyPaths). Without it the write
// fails with "Permission denied" for the non-root user only.
func TestProcSysIsReadOnly(t *testing.T) {
	t.Parallel()
	onPaths(t, func(t *testing.T, h *harness) {
		const corePattern = "/proc/sys/kernel/core_pattern"
		before, err := os.ReadFile(corePattern)
		require.NoError(t, err)
		in, _ := h.input(t, "procsys", fmt.Sprintf(`(echo '|/tmp/pwn' > %[1]s) 2>&1; echo "exit $?"
(sysctl -w kernel.core_pattern='|/tmp/pwn') 2>&1; echo "exit $?"`, corePattern))

		out, err := h.execute(in)
		require.NoError(t, err)
		assert.Equal(t, model.StatusSucceeded, out.Status)
		assert.Contains(t, out.Result.OutputStr, "can't create "+corePattern+": Read-only file system")
		assert.NotContains(t, out.Result.OutputStr, "exit 0")
		after, err := os.ReadFile(corePattern)
		require.NoError(t, err)
		assert.Equal(t, string(before), string(after), "the host's core_pattern changed")

		rec := h.record(t, "procsys")
		require.NotNil(t, rec.Probe)
		assert.True(t, rec.Probe.ProcSysReadOnly, "the self-check saw /proc/sys read-only")
	})
}

// What the host's other runs do on disk is invisible inside: the block
// devices' I/O counters, the host's block devices and its loop devices
// (each run's disk cap is one, with its backing file) all read as empty,
// while an unmasked /proc file beside them still reads.
//
// Protection: the masked paths (docker.MaskedPaths: /proc/diskstats,
// /sys/block, /sys/devices/virtual/block). Under runc none of them is
// namespaced, so without the masks each lists the host's devices.
func TestHostBlockActivityIsMaskedInside(t *testing.T) {
	t.Parallel()
	hostStats, err := os.ReadFile("/proc/diskstats")
	require.NoError(t, err)
	hostBlocks, err := os.ReadDir("/sys/block")
	require.NoError(t, err)
	if len(strings.TrimSpace(string(hostStats))) == 0 || len(hostBlocks) == 0 {
		t.Skip("this host shows no block device, so there is nothing to mask")
	}
	const script = `
echo "== diskstats"; cat /proc/diskstats 2>&1
echo "== sysblock"; ls -A /sys/block 2>&1
echo "== virtualblock"; ls -A /sys/devices/virtual/block 2>&1
echo "== stat"; head -n 1 /proc/stat
echo "== end"
`
	for _, rt := range runtimes {
		for _, sp := range startPaths {
			t.Run(rt.name+"/"+sp.name, func(t *testing.T) {
				t.Parallel()
				h := newHarnessOn(t, sp.warm)
				h.requireRuntime(t, rt.runtime)
				in, _ := h.input(t, "blocks", script)
				in.Policy.Runtime = rt.runtime

				out, err := h.execute(in)
				require.NoError(t, err)
				assert.Equal(t, model.StatusSucceeded, out.Status)
				stdout := out.Result.OutputStr
				require.Contains(t, stdout, "== end", "the script ran to the end")
				assert.Contains(t, section(stdout, "stat"), "cpu ", "control: an unmasked /proc file reads")
				for _, name := range []string{"diskstats", "sysblock", "virtualblock"} {
					got := section(stdout, name)
					for _, dev := range hostBlocks {
						assert.NotRegexp(t, `(^|\s)`+regexp.QuoteMeta(dev.Name())+`(\s|$)`, got,
							"%s shows the host's block device %s", name, dev.Name())
					}
				}
			})
		}
	}
}

// The executor's secrets are invisible inside: an environment variable of
// the executor (here also the model API key the gateway reads) and a file
// outside the run directory appear neither in the agent's environment, nor
// in any process's /proc/<pid>/environ, nor anywhere in the filesystem, nor
// in anything stored.
//
// Protection: the container gets an explicit environment (never the
// executor's), the model key stays in the host-side gateway, and only the
// run directory is mounted. Passing the executor's environment or mounting
// host paths puts the canary in the output.
//
// Not parallel: t.Setenv changes the whole test process's environment.
func TestHostSecretsAreInvisibleInside(t *testing.T) {
	secretEnv := "abuse-canary-env-" + rand.Text()
	t.Setenv("TASKRUN_CANARY_SECRET", secretEnv)
	secretDir := t.TempDir()
	secretFile := filepath.Join(secretDir, "secret.txt")
	secretFileValue := "abuse-canary-file-" + rand.Text()
	require.NoError(t, os.WriteFile(secretFile, []byte(secretFileValue), 0o644))
	control := "abuse-canary-control-" + rand.Text()
	script := fmt.Sprintf(`
echo "== env"; env
echo "== environ"; for f in /proc/[0-9]*/environ; do tr '\0' '\n' < $f; done 2>&1
echo "== file"; cat %s 2>&1
echo "== grep"; for d in /*; do case $d in /proc|/sys|/dev) ;; *) grep -r -s -F abuse-canary- $d ;; esac; done
echo "== end"
`, secretFile)

	for _, rt := range runtimes {
		for _, sp := range startPaths {
			t.Run(rt.name+"/"+sp.name, func(t *testing.T) {
				h := newHarnessOn(t, sp.warm)
				h.requireRuntime(t, rt.runtime)
				in, _ := h.input(t, "canary", script)
				in.Policy.Runtime = rt.runtime
				in.Task.Prompt = control
				// Never contacted: the run makes no model request.
				in.Model = config.ModelEntry{Provider: config.ProviderOpenAI, Name: "gpt-test", BaseURL: "http://127.0.0.1:9/v1", APIKeyEnv: "TASKRUN_CANARY_SECRET"}

				out, err := h.execute(in)
				require.NoError(t, err)
				assert.Equal(t, model.StatusSucceeded, out.Status)
				stdout := out.Result.OutputStr
				require.Contains(t, stdout, "== end", "the script ran to the end")
				// Controls: each search did find what is meant to be there.
				assert.Contains(t, section(stdout, "env"), "TASKRUN_MODEL_SOCKET=")
				assert.Contains(t, section(stdout, "environ"), "TASKRUN_RUN_ID=canary")
				assert.Contains(t, section(stdout, "file"), "No such file or directory")
				assert.Contains(t, section(stdout, "grep"), "/taskrun/prompt.txt:"+control)

				stderr := h.runFile(t, "canary", taskrun.StderrLogName)
				for _, secret := range []string{secretEnv, secretFileValue} {
					assert.NotContains(t, stdout, secret, "stdout shows a host secret")
					assert.NotContains(t, stderr, secret, "stderr shows a host secret")
					for _, k := range h.storedKeys(t) {
						assert.NotContains(t, h.objectText(t, k), secret, "object %s holds a host secret", k)
					}
				}
			})
		}
	}
}

// startCounter counts the containers a backend was asked to start.
type startCounter struct {
	sandbox.Backend
	starts *atomic.Int32
}

// Start counts the call and starts the container.
func (c startCounter) Start(ctx context.Context, spec sandbox.Spec, p sandbox.Policy, s sandbox.Streams) (sandbox.Handle, error) {
	c.starts.Add(1)
	return c.Backend.Start(ctx, spec, p, s)
}

// IDs that would form or escape a path are refused before anything is
// created: no directory under the run root, no stored object, no container.
// A refusal is still reported FAILED, unless the run ID itself is bad (it
// names the PATCH URL).
//
// Protection: ID validation ([A-Za-z0-9_-]{1,128}) before the run touches
// disk or Docker. Without it "../x" creates directories outside the run's
// place and starts a container.
func TestPathTraversalIDsAreRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	counter := startCounter{Backend: h.Backend, starts: &atomic.Int32{}}
	setters := []struct {
		kind string
		set  func(*taskrun.RunTaskInput, string)
	}{
		{"user", func(in *taskrun.RunTaskInput, id string) { in.Task.UserID = id }},
		{"conversation", func(in *taskrun.RunTaskInput, id string) { in.Task.ConversationID = id }},
		{"task", func(in *taskrun.RunTaskInput, id string) { in.Task.ID, in.Run.TaskID = id, id }},
		{"run", func(in *taskrun.RunTaskInput, id string) { in.Run.ID = id }},
		{"session", func(in *taskrun.RunTaskInput, id string) { in.SessionID = id }},
		{"previous run", func(in *taskrun.RunTaskInput, id string) { in.Run.PreviousRunID = id }},
	}
	for _, s := range setters {
		for _, bad := range []string{"../x", "a/b", "..", "/etc", "x/../../y"} {
			in, rec := h.input(t, "okrun", "touch /taskrun/output/ran")
			in.Sandbox = counter
			s.set(&in, bad)

			out, err := taskrun.Execute(context.Background(), in)
			require.ErrorIs(t, err, model.ErrInvalidID, "%s ID %q", s.kind, bad)
			require.ErrorIs(t, err, taskrun.ErrRunFailed)
			assert.Contains(t, err.Error(), s.kind+" ID", "the error names the bad ID")
			assert.Equal(t, model.StatusFailed, out.Status)
			assert.Empty(t, out.ContainerID)

			entries, err := os.ReadDir(h.Root)
			require.NoError(t, err)
			assert.Empty(t, entries, "%s ID %q created something under the run root", s.kind, bad)
			keys, err := h.Store.List(context.Background(), "")
			require.NoError(t, err)
			assert.Empty(t, keys, "%s ID %q stored something", s.kind, bad)

			patches := rec.Patches()
			if s.kind == "run" {
				assert.Empty(t, patches, "a bad run ID cannot name a PATCH URL")
				continue
			}
			require.Len(t, patches, 1, "the refused run is reported")
			assert.Equal(t, model.StatusFailed, patches[0].Status)
		}
	}
	assert.Zero(t, counter.starts.Load(), "a container was started for a bad ID")
	_, err := os.Stat(filepath.Join(filepath.Dir(h.Root), "x"))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing was created beside the run root")
}
