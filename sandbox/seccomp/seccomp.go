// Package seccomp is taskrun's own seccomp profile: Docker's default profile
// (github.com/moby/profiles/seccomp) with the kernel surface a sandboxed agent
// never needs taken away. Every run container gets it inline
// (SecurityOpt "seccomp=<JSON>"), and the isolation record names it by Name and
// the SHA-256 of that JSON (Digest).
//
// What the profile refuses beyond Docker's default, whatever capabilities a
// container is given:
//
//   - io_uring_setup, io_uring_enter, io_uring_register: io_uring is a large,
//     often exploited kernel surface that also bypasses seccomp filtering of
//     the operations it performs.
//   - userfaultfd: a common primitive for stalling the kernel in exploits.
//   - perf_event_open and bpf: kernel introspection and in-kernel programs.
//   - socket(2) of any address family but AF_UNIX, AF_INET, AF_INET6 and
//     AF_NETLINK: AF_VSOCK (not network-namespaced: a --network none sandbox
//     would reach the VM host's vsock), AF_PACKET, AF_ALG, AF_XDP, AF_KEY,
//     Bluetooth, CAN, RDS, TIPC and the rest fail with EPERM, the profile's
//     default action. (EAFNOSUPPORT for them would need a second action on
//     socket's first argument, which libseccomp refuses when the filter is
//     loaded.)
//   - socketcall: the 32-bit x86 multiplexer passes socket(2)'s arguments in
//     memory, where seccomp cannot see them, so it would bypass the family
//     allowlist. 32-bit programs use the direct socket syscalls (Linux 4.3+).
//
// ptrace of processes outside the agent's own tree cannot be expressed in
// seccomp: a filter sees only the syscall's arguments, not whether the target
// pid descends from the caller. What confines ptrace instead: the container's
// own PID namespace (no process of the host or of another run has a pid the
// agent can name), no CAP_SYS_PTRACE (the kernel then allows tracing only
// processes of the same uid, and each live run has a uid of its own), and
// no-new-privileges. Inside its container the agent can trace its own
// processes (debuggers keep working), and the container's init, which is
// equally unprivileged.
package seccomp

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sync"

	moby "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Name names this version of the profile. It changes whenever the profile's
// rules change, and so does its Digest.
const Name = "taskrun-v1"

// DeniedSyscalls are refused whatever capabilities the container has.
var DeniedSyscalls = []string{
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"userfaultfd",
	"perf_event_open",
	"bpf",
	"socketcall",
}

// AllowedSocketFamilies are the only address families socket(2) accepts.
var AllowedSocketFamilies = []int{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// Profile returns a fresh copy of the profile in Docker's JSON profile format.
func Profile() *moby.Seccomp {
	p := moby.DefaultProfile()
	syscalls := make([]*moby.Syscall, 0, len(p.Syscalls)+len(AllowedSocketFamilies))
	for _, s := range p.Syscalls {
		// Docker's socket rule allows every family but AF_VSOCK; the
		// allowlist below replaces it.
		s.Names = slices.DeleteFunc(slices.Clone(s.Names), func(n string) bool {
			return n == "socket" || slices.Contains(DeniedSyscalls, n)
		})
		if len(s.Names) > 0 {
			syscalls = append(syscalls, s)
		}
	}
	for _, family := range AllowedSocketFamilies {
		syscalls = append(syscalls, &moby.Syscall{LinuxSyscall: specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: uint64(family), Op: specs.OpEqualTo}},
		}})
	}
	p.Syscalls = syscalls
	return p
}

var profileJSON = sync.OnceValue(func() []byte {
	b, err := json.Marshal(Profile())
	if err != nil {
		panic("seccomp: marshal taskrun's profile: " + err.Error()) // a fixed struct always marshals
	}
	return b
})

// JSON is the profile as the compact JSON document handed to the engine. The
// returned slice must not be modified.
func JSON() []byte { return profileJSON() }

// SecurityOpt is the Docker security option that applies the profile.
func SecurityOpt() string { return "seccomp=" + string(JSON()) }

// Digest is "sha256:" and the hex SHA-256 of a profile document, the form in
// which isolation records name a profile.
func Digest(profile []byte) string {
	sum := sha256.Sum256(profile)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// SHA256 is the Digest of this profile's JSON.
func SHA256() string { return digest() }

var digest = sync.OnceValue(func() string { return Digest(JSON()) })
