package abuse_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	mobyseccomp "github.com/moby/profiles/seccomp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
)

// The kernel-surface tests run internal/testbin/kernelcalls, a static
// program making raw system calls, as the agent: copied in with the
// workspace, as a hostile agent brings its own binaries. It prints
// "<call> OK" or "<call> <errno>" per call.
const kernelCallsPkg = "./internal/testbin/kernelcalls"

// kernelCalls maps each call kernelcalls makes to "OK", its errno name,
// "KILLED" (seccomp killed the calling thread) or noABI.
type kernelCalls map[string]string

// noABI is kernelcalls' answer for a call the kernel cannot take at all:
// "int $0x80" on a kernel without the 32-bit x86 ABI (ia32_emulation=0)
// faults before any system call, whatever the sandbox.
const noABI = "NOABI"

func parseKernelCalls(t *testing.T, out string) kernelCalls {
	t.Helper()
	calls := kernelCalls{}
	for line := range strings.Lines(out) {
		name, result, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok {
			calls[name] = result
		}
	}
	require.Contains(t, calls, "bpf", "kernelcalls ran to its last call: %q", out)
	return calls
}

// kernelRun is kernelcalls' result under one configuration, computed once
// per test process and shared by the tests of each class.
type kernelRun struct {
	once  sync.Once
	calls kernelCalls
	rec   *audit.Record
}

var kernelRuns sync.Map // configuration name -> *kernelRun

// kernelCallsInRun runs kernelcalls through taskrun.Execute under runtime
// ("" for runc) and returns its results and the run's isolation record.
func kernelCallsInRun(t *testing.T, runtime string) (kernelCalls, audit.Record) {
	t.Helper()
	return kernelCallsOnPath(t, runtime, false)
}

// kernelCallsOnPath is kernelCallsInRun, in a warm pool's parked container
// when warm.
func kernelCallsOnPath(t *testing.T, runtime string, warm bool) (kernelCalls, audit.Record) {
	t.Helper()
	h := newHarnessOn(t, warm)
	h.requireRuntime(t, runtime)
	v, _ := kernelRuns.LoadOrStore(fmt.Sprintf("run %s warm=%t", runtime, warm), &kernelRun{})
	kr := v.(*kernelRun)
	kr.once.Do(func() {
		ws := t.TempDir()
		copyExecutable(t, testbin.Program(t, kernelCallsPkg), filepath.Join(ws, "kernelcalls"))
		in, _ := h.input(t, "kernelcalls", "./kernelcalls")
		in.Task.WorkspaceDir = ws
		in.Policy.Runtime = runtime
		out, err := h.execute(in)
		require.NoError(t, err)
		require.Equal(t, model.StatusSucceeded, out.Status, out.Reason)
		rec := h.record(t, "kernelcalls")
		kr.calls, kr.rec = parseKernelCalls(t, out.Result.OutputStr), &rec
	})
	require.NotNil(t, kr.calls, "the kernelcalls run under %q failed in another test", runtime)
	return kr.calls, *kr.rec
}

// kernelCallsWithout runs kernelcalls in a container confined as taskrun
// confines a run (non-root, no capabilities, no-new-privileges, network
// none) but with seccompOpt instead of taskrun's profile: "" is the engine's
// default profile, "seccomp=unconfined" none at all. It shows what each
// protection is worth: the attacks that succeed here are the ones taskrun's
// profile stops.
func kernelCallsWithout(t *testing.T, seccompOpt string) kernelCalls {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real containers")
	}
	v, _ := kernelRuns.LoadOrStore("control "+seccompOpt, &kernelRun{})
	kr := v.(*kernelRun)
	kr.once.Do(func() {
		cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
		require.NoError(t, err)
		defer cli.Close()
		ctx := context.Background()
		secOpts := []string{"no-new-privileges"}
		if seccompOpt != "" {
			secOpts = append(secOpts, seccompOpt)
		}
		resp, err := cli.ContainerCreate(ctx, &container.Config{
			Image:  testImage,
			User:   "10001:10001",
			Cmd:    []string{"/kernelcalls"},
			Labels: map[string]string{"dev.taskrun.test.abuse": "kernelcalls"},
		}, &container.HostConfig{
			NetworkMode: "none",
			CapDrop:     []string{"ALL"},
			SecurityOpt: secOpts,
			Mounts: []mount.Mount{{
				Type: mount.TypeBind, Source: testbin.Program(t, kernelCallsPkg), Target: "/kernelcalls", ReadOnly: true,
			}},
		}, nil, nil, "")
		require.NoError(t, err)
		defer cli.ContainerRemove(context.Background(), resp.ID, container.RemoveOptions{Force: true})
		require.NoError(t, cli.ContainerStart(ctx, resp.ID, container.StartOptions{}))
		waitCh, errCh := cli.ContainerWait(ctx, resp.ID, container.WaitConditionNotRunning)
		select {
		case w := <-waitCh:
			require.Zero(t, w.StatusCode)
		case err := <-errCh:
			require.NoError(t, err)
		}
		logs, err := cli.ContainerLogs(ctx, resp.ID, container.LogsOptions{ShowStdout: true})
		require.NoError(t, err)
		defer logs.Close()
		var stdout strings.Builder
		_, err = stdcopy.StdCopy(&stdout, io.Discard, logs)
		require.NoError(t, err)
		kr.calls = parseKernelCalls(t, stdout.String())
	})
	require.NotNil(t, kr.calls, "the control run %q failed in another test", seccompOpt)
	return kr.calls
}

// copyExecutable copies a program into a workspace, executable by everyone.
func copyExecutable(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dst, data, 0o755))
}

// mobyDefaultProfile is Docker's current default profile (the module taskrun's
// profile derives from) as an inline security option.
func mobyDefaultProfile(t *testing.T) string {
	t.Helper()
	b, err := json.Marshal(mobyseccomp.DefaultProfile())
	require.NoError(t, err)
	return "seccomp=" + string(b)
}

// assertKernelClass checks the named calls' results under every
// configuration and logs them, so the test's output is the record of what
// each layer refuses. Under gVisor the answers are gVisor's own (ENOSYS,
// ENODEV, EAFNOSUPPORT): runsc does not apply the OCI seccomp profile.
func assertKernelClass(t *testing.T, names []string, check func(t *testing.T, name string, runc, gvisor, dockerDefault, unconfined string)) {
	t.Helper()
	t.Parallel()
	runc, rec := kernelCallsInRun(t, "")
	assert.Equal(t, audit.TaskrunSeccompProfile(), rec.Options.SeccompProfile, "audit.json names the profile")
	assert.Contains(t, rec.Posture.SecurityOpt, "seccomp="+audit.TaskrunSeccompProfile().SHA256)
	dockerDefault := kernelCallsWithout(t, "")
	unconfined := kernelCallsWithout(t, "seccomp=unconfined")
	var gvisor kernelCalls
	if h := newHarness(t); h.hasRuntime(t, runtimes[1].runtime) {
		gvisor, _ = kernelCallsInRun(t, runtimes[1].runtime)
	}
	// A warm run's container answers every call as a cold run's does.
	warm, _ := kernelCallsOnPath(t, "", true)
	for _, name := range names {
		assert.Equal(t, runc[name], warm[name], "%s in a warm pool's container", name)
	}
	for _, name := range names {
		t.Logf("%-18s runc+taskrun: %-8s gvisor+taskrun: %-8s runc+docker-default: %-8s runc+unconfined: %s",
			name, runc[name], gvisor[name], dockerDefault[name], unconfined[name])
		check(t, name, runc[name], gvisor[name], dockerDefault[name], unconfined[name])
	}
}

// io_uring_setup fails inside a run under runc; under the engine's default
// profile it returns a descriptor.
//
// Protection: taskrun's seccomp profile (sandbox/seccomp) refuses
// io_uring_setup/enter/register. With the engine's default profile (this
// 20.10 engine's) the call succeeds, so the test fails without the profile.
//
// Under gVisor the call succeeds: runsc does not load the container's OCI
// seccomp profile (unless the runtime is registered with --oci-seccomp), and
// the io_uring the agent gets is the gVisor Sentry's own implementation, not
// the host kernel's. The test pins that, so a change in gVisor shows here.
func TestIoUringIsRefused(t *testing.T) {
	assertKernelClass(t, []string{"io_uring_setup"}, func(t *testing.T, name, runc, gvisor, dockerDefault, _ string) {
		assert.Equal(t, "EPERM", runc, "%s under runc with taskrun's profile", name)
		assert.Equal(t, "OK", dockerDefault, "%s is allowed by the engine's default profile", name)
		if gvisor != "" {
			assert.Equal(t, "OK", gvisor, "%s under gVisor is the Sentry's own io_uring", name)
		}
	})
}

// socket(AF_VSOCK) fails inside a run, and so do the other address families
// a sandbox never needs; AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK work. Under
// the engine's default profile an AF_VSOCK socket binds a port on the VM's
// vsock, which --network none does not isolate. Docker's current default
// profile refuses socket(AF_VSOCK) but not the same socket opened through
// the 32-bit socketcall(2) ("int $0x80"), whose arguments seccomp cannot
// see; taskrun's profile leaves the 32-bit x86 ABI out, so the kernel kills
// the calling thread.
//
// Protection: the profile's allowlist on socket(2)'s first argument, and no
// 32-bit x86 ABI. Without the first the vsock bind succeeds; without the
// second socketcall_vsock succeeds, as it does under Docker's current
// default profile. gVisor answers int $0x80 itself (the host kernel never
// sees it, and gVisor has no vsock); its answer is only logged.
func TestVsockAndUnneededSocketFamiliesAreRefused(t *testing.T) {
	if runtime.GOARCH == "amd64" {
		moby := kernelCallsWithout(t, mobyDefaultProfile(t))
		t.Logf("socketcall_vsock under Docker's current default profile: %s", moby["socketcall_vsock"])
		if moby["socketcall_vsock"] == noABI {
			t.Log("this kernel has no 32-bit x86 ABI (int $0x80 faults), so no profile is needed to refuse socketcall here")
		} else {
			assert.Equal(t, "OK", moby["socketcall_vsock"], "Docker's current default profile lets socketcall open AF_VSOCK")
		}
		assert.Equal(t, "EPERM", moby["socket_vsock_bind"], "and refuses socket(AF_VSOCK)")
	}
	refused := []string{"socket_vsock_bind", "socketcall_vsock", "socket_alg", "socket_packet", "socket_key"}
	allowed := []string{"socket_unix", "socket_inet", "socket_inet6", "socket_netlink"}
	assertKernelClass(t, append(refused, allowed...), func(t *testing.T, name, runc, gvisor, dockerDefault, _ string) {
		if !strings.Contains(strings.Join(refused, " "), name) {
			assert.Equal(t, "OK", runc, "%s is a family a sandbox needs", name)
			return
		}
		if name == "socketcall_vsock" {
			if runtime.GOARCH != "amd64" {
				return
			}
			if dockerDefault == noABI {
				// The kernel refuses the ABI itself: every configuration
				// faults. The profile's leaving the ABI out is pinned by
				// sandbox/seccomp's TestProfileLeavesOutThe32BitX86ABI.
				assert.Equal(t, noABI, runc, "a kernel without the 32-bit ABI refuses int $0x80 in a run too")
				return
			}
			assert.Equal(t, "KILLED", runc, "the 32-bit x86 ABI is left out of the profile")
			assert.Equal(t, "OK", dockerDefault)
			return
		}
		assert.Equal(t, "EPERM", runc, "%s under runc with taskrun's profile", name)
		if name == "socket_vsock_bind" {
			assert.Equal(t, "OK", dockerDefault, "the engine's default profile lets AF_VSOCK bind")
		}
		if gvisor != "" {
			assert.NotEqual(t, "OK", gvisor, "%s under gVisor", name)
		}
	})
}

// A netlink socket for the host's device events (NETLINK_KOBJECT_UEVENT)
// fails inside a run; routing netlink still works (TestVsockAnd...). Under
// runc a container whose network namespace belongs to the host's user
// namespace receives every uevent of the host: other runs' loop devices
// being set up and torn down.
//
// Protection: the profile's socket rule for AF_NETLINK also requires a
// protocol other than NETLINK_KOBJECT_UEVENT. Under the engine's default
// profile the socket opens.
func TestUeventSocketIsRefused(t *testing.T) {
	assertKernelClass(t, []string{"socket_netlink_uevent"}, func(t *testing.T, name, runc, gvisor, dockerDefault, _ string) {
		assert.Equal(t, "EPERM", runc, "%s under runc with taskrun's profile", name)
		assert.Equal(t, "OK", dockerDefault, "%s is allowed by the engine's default profile", name)
		if gvisor != "" {
			t.Logf("%s under gVisor: %s (its uevents are the sandbox's own)", name, gvisor)
		}
	})
}

// userfaultfd fails inside a run. Without any seccomp profile an
// unprivileged process gets a user-mode-only descriptor.
//
// Protection: the profile refuses userfaultfd whatever the capabilities.
// Unconfined, the call succeeds.
func TestUserfaultfdIsRefused(t *testing.T) {
	assertKernelClass(t, []string{"userfaultfd"}, func(t *testing.T, name, runc, gvisor, _, unconfined string) {
		assert.Equal(t, "EPERM", runc, "%s under runc with taskrun's profile", name)
		assert.Equal(t, "OK", unconfined, "%s succeeds without seccomp", name)
		if gvisor != "" {
			assert.NotEqual(t, "OK", gvisor, "%s under gVisor", name)
		}
	})
}

// perf_event_open fails inside a run, even for the caller's own CPU clock,
// which the host's perf_event_paranoid otherwise allows an unprivileged
// process.
//
// Protection: the profile refuses perf_event_open whatever the
// capabilities. Unconfined, the call succeeds.
func TestPerfEventOpenIsRefused(t *testing.T) {
	assertKernelClass(t, []string{"perf_event_open"}, func(t *testing.T, name, runc, gvisor, _, unconfined string) {
		assert.Equal(t, "EPERM", runc, "%s under runc with taskrun's profile", name)
		assert.Equal(t, "OK", unconfined, "%s succeeds without seccomp", name)
		if gvisor != "" {
			assert.NotEqual(t, "OK", gvisor, "%s under gVisor", name)
		}
	})
}

// bpf fails inside a run.
//
// Protection: the profile refuses bpf whatever the capabilities; the host's
// kernel.unprivileged_bpf_disabled refuses it too (which is why the
// unconfined control is only logged).
func TestBPFIsRefused(t *testing.T) {
	assertKernelClass(t, []string{"bpf"}, func(t *testing.T, name, runc, gvisor, _, _ string) {
		assert.Equal(t, "EPERM", runc, "%s under runc with taskrun's profile", name)
		if gvisor != "" {
			assert.NotEqual(t, "OK", gvisor, "%s under gVisor", name)
		}
	})
}
