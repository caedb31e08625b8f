// Command pause is the test cluster's pod sandbox process: it holds the pod's
// namespaces open and does nothing until it is told to stop. kube-up builds it
// statically into the image taskrun.local/pause:1 (FROM scratch), so the
// cluster's container runtime never pulls a sandbox image from a registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	// As PID 1 of the pod it also reaps the orphans reparented to it.
	reap := make(chan os.Signal, 1)
	signal.Notify(reap, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			return
		case <-reap:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
