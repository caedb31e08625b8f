package main

import (
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// int80 makes a 32-bit x86 system call ("int $0x80") from this 64-bit
// program; it returns EAX.
func int80(trap, a1, a2, a3 uintptr) uintptr

// socketcallVsock opens an AF_VSOCK socket through the 32-bit socketcall(2)
// multiplexer, whose arguments are in memory where seccomp cannot see them.
func socketcallVsock() unix.Errno {
	const sysSocketcall, sysSocket, map32bit = 102, 1, 0x40
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|map32bit)
	if err != nil {
		return err.(unix.Errno)
	}
	args := (*[3]uint32)(unsafe.Pointer(&mem[0]))
	args[0], args[1], args[2] = unix.AF_VSOCK, unix.SOCK_STREAM, 0
	result := make(chan int32, 1)
	go func() {
		runtime.LockOSThread() // if seccomp kills the thread, it takes only this one
		result <- int32(int80(sysSocketcall, sysSocket, uintptr(unsafe.Pointer(&mem[0])), 0))
	}()
	select {
	case r := <-result:
		if r < 0 {
			return unix.Errno(-r)
		}
		unix.Close(int(r))
		return 0
	case <-time.After(2 * time.Second):
		return errKilled
	}
}
