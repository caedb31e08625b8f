package seccomp

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	moby "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// allowedBy reports whether any rule of p allows name, whatever its
// conditions (capabilities, arguments, kernel version).
func allowedBy(p *moby.Seccomp, name string) bool {
	for _, s := range p.Syscalls {
		for _, n := range s.Names {
			if n == name && s.Action == specs.ActAllow {
				return true
			}
		}
	}
	return false
}

func TestProfileRefusesWhatDockersDefaultAllows(t *testing.T) {
	docker, ours := moby.DefaultProfile(), Profile()
	// Docker's default allows these, some only with a capability.
	for _, name := range []string{"socket", "socketcall", "bpf", "perf_event_open"} {
		assert.True(t, allowedBy(docker, name), "Docker's default allows %s", name)
	}
	for _, name := range DeniedSyscalls {
		assert.False(t, allowedBy(ours, name), "%s is refused under every condition", name)
	}
	assert.Equal(t, specs.ActErrno, ours.DefaultAction)
	require.NotNil(t, ours.DefaultErrnoRet)
	assert.EqualValues(t, unix.EPERM, *ours.DefaultErrnoRet)
}

func TestSocketIsAnAllowlistOfFamilies(t *testing.T) {
	var families []uint64
	for _, s := range Profile().Syscalls {
		for _, n := range s.Names {
			if n != "socket" {
				continue
			}
			require.Equal(t, []string{"socket"}, s.Names, "socket has rules of its own")
			assert.Equal(t, specs.ActAllow, s.Action)
			assert.Nil(t, s.Includes)
			require.NotEmpty(t, s.Args)
			assert.Equal(t, specs.OpEqualTo, s.Args[0].Op)
			assert.Zero(t, s.Args[0].Index)
			families = append(families, s.Args[0].Value)
			if s.Args[0].Value == unix.AF_NETLINK {
				require.Len(t, s.Args, 2)
				assert.Equal(t, specs.LinuxSeccompArg{Index: 2, Value: unix.NETLINK_KOBJECT_UEVENT, Op: specs.OpNotEqual}, s.Args[1],
					"netlink but the host's device events")
			} else {
				require.Len(t, s.Args, 1)
			}
		}
	}
	assert.ElementsMatch(t, []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}, families)
}

func TestProfileKeepsTheRestOfDockersDefault(t *testing.T) {
	for _, name := range []string{"read", "write", "execve", "clone", "mmap", "ptrace", "connect", "bind", "epoll_wait", "inotify_init1"} {
		assert.True(t, allowedBy(Profile(), name), name)
	}
}

func TestJSONIsStableAndNamedByDigest(t *testing.T) {
	fresh, err := json.Marshal(Profile())
	require.NoError(t, err)
	assert.Equal(t, string(fresh), string(JSON()), "the JSON is the marshalled profile")
	assert.Equal(t, Digest(JSON()), SHA256())
	assert.True(t, strings.HasPrefix(SHA256(), "sha256:"))
	assert.Len(t, SHA256(), len("sha256:")+64)
	assert.Equal(t, "seccomp="+string(JSON()), SecurityOpt())

	var back moby.Seccomp
	require.NoError(t, json.Unmarshal(JSON(), &back), "the engine's profile format reads it")
	assert.Len(t, back.Syscalls, len(Profile().Syscalls))
}

func TestProfileLeavesOutThe32BitX86ABI(t *testing.T) {
	var x8664 bool
	for _, a := range Profile().ArchMap {
		assert.NotContains(t, a.SubArches, specs.ArchX86, "%s", a.Arch)
		if a.Arch == specs.ArchX86_64 {
			x8664 = true
			assert.Contains(t, a.SubArches, specs.ArchX32)
		}
		assert.NotEqual(t, specs.ArchX86, a.Arch)
	}
	assert.True(t, x8664)
	var dockerHasX86 bool
	for _, a := range moby.DefaultProfile().ArchMap {
		dockerHasX86 = dockerHasX86 || slices.Contains(a.SubArches, specs.ArchX86)
	}
	assert.True(t, dockerHasX86, "Docker's default includes it")
}
