//go:build !amd64

package main

import "golang.org/x/sys/unix"

// socketcallVsock is amd64's 32-bit socketcall attack; elsewhere it reports
// ENOSYS.
func socketcallVsock() unix.Errno { return unix.ENOSYS }

// runSocketcallChild is amd64's alone.
func runSocketcallChild() { panic("socketcall child on a non-amd64 build") }

// socketcallChild is the argument that makes kernelcalls the socketcall child.
const socketcallChild = "socketcall-child"
