// Command taskrun-runsc-restore is the OCI runtime through which the Docker
// engine restores a gVisor container from a taskrun checkpoint: it runs
// runsc for every call, and `runsc restore` instead of `runsc create` for a
// container whose spec names a checkpoint image (see package runscrestore
// and docs/checkpoints.md).
package main

import (
	"os"

	"github.com/taskrun/taskrun/sandbox/docker/runscrestore"
)

func main() { os.Exit(runscrestore.Main(os.Args[1:], os.Stderr)) }
