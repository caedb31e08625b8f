// Command taskrun-relay is the model-gateway and egress relay (package relay)
// as a program of its own. The taskrun binary carries the same code and runs
// it when invoked as taskrun-relay, which is how runs get it; build this one
// static (CGO_ENABLED=0) to mount it from a helpers directory instead.
package main

import (
	"os"

	"github.com/taskrun/taskrun/relay"
)

func main() { os.Exit(relay.Main(os.Args[1:])) }
