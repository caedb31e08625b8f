// Command inotifyhog is a hostile workload for the per-user limit tests.
//
//	inotifyhog hold   opens inotify instances until the kernel refuses,
//	                  prints "held N <errno>", then sleeps until killed
//	inotifyhog try    prints "inotify_init OK" or "inotify_init <errno>"
//
// inotify instances are counted per user (fs.inotify.max_user_instances), so
// a process that holds them all starves every other process of its uid.
// It is built static (CGO_ENABLED=0) and runs in any image.
package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: inotifyhog hold|try")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "hold":
		held := 0
		var errno unix.Errno
		for {
			_, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			if err != nil {
				errors.As(err, &errno)
				break
			}
			held++
		}
		fmt.Printf("held %d %s\n", held, unix.ErrnoName(errno))
		for {
			time.Sleep(time.Hour)
		}
	case "try":
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			var errno unix.Errno
			errors.As(err, &errno)
			fmt.Printf("inotify_init %s\n", unix.ErrnoName(errno))
			return
		}
		unix.Close(fd)
		fmt.Println("inotify_init OK")
	default:
		fmt.Fprintln(os.Stderr, "usage: inotifyhog hold|try")
		os.Exit(2)
	}
}
