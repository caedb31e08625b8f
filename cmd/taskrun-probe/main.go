// Command taskrun-probe is the in-sandbox self-check (probe.Main) as a
// program of its own. The taskrun binary carries the same code and runs it
// when invoked as taskrun-probe, which is how runs get it; build this one
// static (CGO_ENABLED=0) to mount it from a helpers directory instead.
package main

import (
	"os"

	"github.com/taskrun/taskrun/probe"
)

func main() { os.Exit(probe.Main(os.Args[1:])) }
