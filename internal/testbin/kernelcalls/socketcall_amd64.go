package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// int80 makes a 32-bit x86 system call ("int $0x80") from this 64-bit
// program; it returns EAX.
func int80(trap, a1, a2, a3 uintptr) uintptr

// int81 faults as int80 does on a kernel without the 32-bit x86 ABI.
func int81(trap, a1, a2, a3 uintptr) uintptr

// socketcallChild is the argument that makes kernelcalls the child that
// attempts the 32-bit socketcall.
const socketcallChild = "socketcall-child"

// envSimulateNoIA32 makes the child fault as a kernel without the 32-bit x86
// ABI makes it fault, so the probe's handling of such a kernel is tested on
// a kernel that has the ABI.
const envSimulateNoIA32 = "KERNELCALLS_SIMULATE_NO_IA32"

// childDeadline bounds a child that neither answers nor dies, which no
// kernel answer leads to: the child reports a killed thread itself (see
// runSocketcallChild). The margin covers a process start on a loaded machine.
const childDeadline = 2 * time.Minute

// socketcallVsock opens an AF_VSOCK socket through the 32-bit socketcall(2)
// multiplexer, whose arguments are in memory where seccomp cannot see them.
//
// The attempt runs in a child process: on a kernel without the 32-bit ABI
// "int $0x80" faults, and a fault in assembly may take the whole Go process
// down. The child's fate is the answer:
//   - it prints a result: the kernel ran the call (OK or an errno);
//   - it dies by SIGSYS, or reports its thread killed: seccomp killed it (KILLED);
//   - it faults: the kernel has no 32-bit ABI, so the call cannot be made
//     (NOABI).
func socketcallVsock() unix.Errno {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "socketcall: find this program: %v\n", err)
		return unix.ENOEXEC
	}
	cmd := exec.Command(self, socketcallChild)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "socketcall: start the child: %v\n", err)
		return unix.ENOEXEC
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(childDeadline):
		_ = cmd.Process.Kill()
		<-done
		return errKilled
	}
	if err == nil {
		return parseChildResult(strings.TrimSpace(stdout.String()))
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			switch ws.Signal() {
			case syscall.SIGSYS:
				return errKilled
			case syscall.SIGSEGV, syscall.SIGILL, syscall.SIGBUS:
				return errNoABI
			}
		}
		if exit.ExitCode() == childFaulted {
			return errNoABI
		}
	}
	fmt.Fprintf(os.Stderr, "socketcall child: %v: %s\n", err, stderr.String())
	return unix.ENOEXEC
}

// childFaulted is the child's exit code when its call faulted.
const childFaulted = 3

// parseChildResult maps the child's one line back to a result.
func parseChildResult(line string) unix.Errno {
	switch line {
	case "OK":
		return 0
	case "KILLED":
		return errKilled
	case "NOABI":
		return errNoABI
	}
	for errno := unix.Errno(1); errno < 4096; errno++ {
		if unix.ErrnoName(errno) == line {
			return errno
		}
	}
	fmt.Fprintf(os.Stderr, "socketcall child printed %q\n", line)
	return unix.ENOEXEC
}

// runSocketcallChild is the child: it makes the call on a thread of its own,
// prints one line and exits.
func runSocketcallChild() {
	const sysSocketcall, sysSocket, map32bit = 102, 1, 0x40
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|map32bit)
	if err != nil {
		fmt.Println(unix.ErrnoName(err.(unix.Errno)))
		os.Exit(0)
	}
	args := (*[3]uint32)(unsafe.Pointer(&mem[0]))
	args[0], args[1], args[2] = unix.AF_VSOCK, unix.SOCK_STREAM, 0
	trap := int80
	if os.Getenv(envSimulateNoIA32) != "" {
		trap = int81
	}
	result, tid := make(chan int32, 1), make(chan int, 1)
	go func() {
		runtime.LockOSThread() // if seccomp kills the thread, it takes only this one
		tid <- unix.Gettid()
		// A fault becomes a panic here rather than the runtime's crash, where
		// the runtime can turn it into one; otherwise the child dies of it and
		// the parent reads the signal or the runtime's exit code.
		debug.SetPanicOnFault(true)
		defer func() {
			if recover() != nil {
				fmt.Println("NOABI")
				os.Exit(childFaulted)
			}
		}()
		result <- int32(trap(sysSocketcall, sysSocket, uintptr(unsafe.Pointer(&mem[0])), 0))
	}()
	thread := fmt.Sprintf("/proc/self/task/%d", <-tid)
	for {
		select {
		case r := <-result:
			if r < 0 {
				fmt.Println(unix.ErrnoName(unix.Errno(-r)))
			} else {
				unix.Close(int(r))
				fmt.Println("OK")
			}
			os.Exit(0)
		case <-time.After(10 * time.Millisecond):
			// A thread seccomp killed is gone from the task list without a
			// word, or a zombie there if it was the main thread; the call's
			// result can only be missing then.
			if threadGone(thread) {
				select {
				case r := <-result:
					result <- r
					continue
				default:
				}
				fmt.Println("KILLED")
				os.Exit(0) // the killed thread must not keep the process waiting
			}
		}
	}
}

// threadGone reports whether the thread at /proc/self/task/TID has ended: it
// is gone, or a zombie (a killed main thread stays listed until the process
// ends).
func threadGone(dir string) bool {
	stat, err := os.ReadFile(dir + "/stat")
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return true
	}
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis: "pid (comm) S ...".
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	state := stat[i+2]
	return state == 'Z' || state == 'X'
}
