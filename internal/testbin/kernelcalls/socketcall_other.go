//go:build !amd64

package main

import "golang.org/x/sys/unix"

// socketcallVsock is amd64's 32-bit socketcall attack; elsewhere it reports
// ENOSYS.
func socketcallVsock() unix.Errno { return unix.ENOSYS }
