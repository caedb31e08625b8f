package main

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// results runs kernelcalls with env added and maps each call to its result.
func results(t *testing.T, env ...string) map[string]string {
	t.Helper()
	cmd := exec.Command(testbin.Program(t, "./internal/testbin/kernelcalls"))
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	require.NoError(t, err, "kernelcalls exits 0 whatever the kernel answers: %s", out)
	calls := map[string]string{}
	for line := range strings.Lines(string(out)) {
		name, result, ok := strings.Cut(strings.TrimSpace(line), " ")
		require.True(t, ok, "line %q", line)
		calls[name] = result
	}
	require.Contains(t, calls, "bpf", "it ran to its last call")
	return calls
}

// On a kernel without the 32-bit x86 ABI, "int $0x80" faults. The probe
// reports that as NOABI and goes on; it never crashes. The fault is
// simulated with a vector user mode may not raise, which faults the same way.
func TestSocketcallOnAKernelWithoutThe32BitABIIsNOABI(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the 32-bit socketcall is amd64's")
	}
	calls := results(t, envSimulateNoIA32+"=1")
	assert.Equal(t, "NOABI", calls["socketcall_vsock"])
}

// On the host, outside any sandbox, the 32-bit socketcall either runs (OK,
// or the kernel's errno for vsock) or, without the ABI, is NOABI; the probe
// itself never dies of it.
func TestSocketcallOnThisKernel(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the 32-bit socketcall is amd64's")
	}
	got := results(t)["socketcall_vsock"]
	t.Logf("socketcall_vsock on the host: %s", got)
	assert.NotEqual(t, "KILLED", got, "no seccomp filter applies on the host")
	assert.NotEmpty(t, got)
}
