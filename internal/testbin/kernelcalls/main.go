// Command kernelcalls is a hostile workload for the abuse tests: it makes the
// raw system calls a sandboxed agent could use to reach kernel surface the
// sandbox takes away, and prints one line per call:
//
//	<call> OK
//	<call> <errno name>
//	<call> KILLED   (seccomp killed the calling thread)
//	<call> NOABI    (the kernel lacks the ABI: int $0x80 faults)
//
// It is built static (CGO_ENABLED=0) and runs in any image.
package main

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// call is one attempt; it returns the errno, or 0 when the call succeeded.
type call struct {
	name string
	do   func() unix.Errno
}

// errKilled stands for a call whose thread the kernel killed (seccomp's
// action for an architecture the profile leaves out); it prints as KILLED.
const errKilled = unix.Errno(1 << 16)

// errNoABI stands for a call the kernel cannot take at all: "int $0x80" on
// a kernel without the 32-bit x86 ABI faults instead of entering the kernel.
// It prints as NOABI; for the sandbox that is a refusal like any other.
const errNoABI = unix.Errno(1<<16 + 1)

func main() {
	if len(os.Args) > 1 && os.Args[1] == socketcallChild {
		runSocketcallChild()
		return
	}
	calls := []call{
		{"io_uring_setup", ioUringSetup},
		{"socket_vsock_bind", vsockBind},
		{"socket_alg", socketOf(unix.AF_ALG, unix.SOCK_SEQPACKET)},
		{"socket_packet", socketOf(unix.AF_PACKET, unix.SOCK_DGRAM)},
		{"socket_key", socketOf(unix.AF_KEY, unix.SOCK_RAW)},
		{"socket_unix", socketOf(unix.AF_UNIX, unix.SOCK_STREAM)},
		{"socket_inet", socketOf(unix.AF_INET, unix.SOCK_STREAM)},
		{"socket_inet6", socketOf(unix.AF_INET6, unix.SOCK_STREAM)},
		{"socket_netlink", socketOf(unix.AF_NETLINK, unix.SOCK_RAW)},
		{"socket_netlink_uevent", netlinkOf(unix.NETLINK_KOBJECT_UEVENT)},
		{"userfaultfd", userfaultfd},
		{"perf_event_open", perfEventOpen},
		{"bpf", bpfMapCreate},
		{"socketcall_vsock", socketcallVsock},
	}
	for _, c := range calls {
		if errno := c.do(); errno == errKilled {
			fmt.Printf("%s KILLED\n", c.name)
		} else if errno == errNoABI {
			fmt.Printf("%s NOABI\n", c.name)
		} else if errno != 0 {
			fmt.Printf("%s %s\n", c.name, unix.ErrnoName(errno))
		} else {
			fmt.Printf("%s OK\n", c.name)
		}
	}
	os.Stdout.Sync()
	os.Exit(0) // a thread killed by seccomp must not keep the process waiting
}

// closeFd closes a descriptor a successful call returned.
func closeFd(fd uintptr) { unix.Close(int(fd)) }

func ioUringSetup() unix.Errno {
	var params [120]byte // struct io_uring_params, zeroed
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
	if errno == 0 {
		closeFd(fd)
	}
	return errno
}

// vsockBind opens an AF_VSOCK socket and binds any port: vsock is not
// network-namespaced, so this reaches the VM host's vsock transport.
func vsockBind() unix.Errno {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	if err != nil {
		return err.(unix.Errno)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: unix.VMADDR_PORT_ANY}); err != nil {
		return err.(unix.Errno)
	}
	return 0
}

func socketOf(family, typ int) func() unix.Errno {
	return func() unix.Errno {
		fd, err := unix.Socket(family, typ, 0)
		if err != nil {
			return err.(unix.Errno)
		}
		unix.Close(fd)
		return 0
	}
}

// netlinkOf opens a netlink socket of the given protocol.
func netlinkOf(protocol int) func() unix.Errno {
	return func() unix.Errno {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, protocol)
		if err != nil {
			return err.(unix.Errno)
		}
		unix.Close(fd)
		return 0
	}
}

// userfaultfd asks for a user-mode-only descriptor, which an unprivileged
// process gets even with vm.unprivileged_userfaultfd=0.
func userfaultfd() unix.Errno {
	const uffdUserModeOnly = 1
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|uffdUserModeOnly, 0, 0)
	if errno == 0 {
		closeFd(fd)
	}
	return errno
}

// perfEventOpen counts the caller's own CPU clock, the least privileged event.
func perfEventOpen() unix.Errno {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_CPU_CLOCK,
		Bits:   unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return err.(unix.Errno)
	}
	unix.Close(fd)
	return 0
}

// bpfMapCreate creates a one-entry array map.
func bpfMapCreate() unix.Errno {
	attr := struct {
		mapType, keySize, valueSize, maxEntries, flags uint32
	}{mapType: unix.BPF_MAP_TYPE_ARRAY, keySize: 4, valueSize: 4, maxEntries: 1}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno == 0 {
		closeFd(fd)
	}
	return errno
}
