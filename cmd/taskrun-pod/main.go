// Command taskrun-pod is the helper inside a run's Pod on Kubernetes (see
// package helpers/podhelper): the fill and keeper containers of
// the taskrun/podhelper:local image run it, and the run container runs the
// copy fill leaves in the Pod. It is kept small on purpose: it starts in
// every run and stays resident as the run container's first process.
package main

import (
	"os"

	"github.com/taskrun/taskrun/helpers/podhelper"
)

func main() {
	os.Exit(podhelper.Main(os.Args[1:]))
}
