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
//   - socket(AF_NETLINK, ..., NETLINK_KOBJECT_UEVENT): under runc, a container
//     whose network namespace belongs to the host's user namespace receives
//     the host's device events (loop devices of other runs being set up and
//     torn down); other netlink protocols (routing, for ip and name
//     resolution) stay allowed.
//   - socketcall, and every system call of the 32-bit x86 ABI (int $0x80):
//     socketcall passes socket(2)'s arguments in memory, where seccomp cannot
//     see them, and libseccomp allows socketcall(SYS_SOCKET) whenever socket
//     is allowed for some family; under Docker's profile a 64-bit program
//     opens an AF_VSOCK socket that way. 32-bit x86 programs do not run in a
//     sandbox. (On s390x and ppc64le, whose native ABI has socketcall, the
//     family allowlist can be bypassed the same way; taskrun's hosts are
//     amd64 and arm64.)
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

// socketcallSubArches are the 32-bit compat ABIs, run by a 64-bit kernel, that
// have socketcall(2): libseccomp turns the socket(2) rules into an
// unconditional socketcall(SYS_SOCKET) rule there (the arguments are in
// memory), which would let "int $0x80" open an AF_VSOCK socket. Leaving them
// out of the profile makes every system call of those ABIs fail.
var socketcallSubArches = []specs.Arch{specs.ArchX86, specs.ArchMIPS, specs.ArchMIPSEL, specs.ArchS390}

// AllowedSocketFamilies are the only address families socket(2) accepts.
var AllowedSocketFamilies = []int{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// Profile returns a fresh copy of the profile in Docker's JSON profile format.
func Profile() *moby.Seccomp {
	p := moby.DefaultProfile()
	for i := range p.ArchMap {
		p.ArchMap[i].SubArches = slices.DeleteFunc(p.ArchMap[i].SubArches, func(a specs.Arch) bool {
			return slices.Contains(socketcallSubArches, a)
		})
	}
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
		args := []specs.LinuxSeccompArg{{Index: 0, Value: uint64(family), Op: specs.OpEqualTo}}
		if family == unix.AF_NETLINK {
			// Any netlink protocol but the host's device events.
			args = append(args, specs.LinuxSeccompArg{Index: 2, Value: unix.NETLINK_KOBJECT_UEVENT, Op: specs.OpNotEqual})
		}
		syscalls = append(syscalls, &moby.Syscall{LinuxSyscall: specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args:   args,
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
