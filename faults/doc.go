// Package faults is taskrun's fault-injection suite: end-to-end tests that
// run the real binaries (`taskrun run`, `taskrun serve`, `taskrun worker`,
// `taskrun gc`) against a real Docker engine and break a part under them
// mid-run (the engine paused or killed, the control plane killed and
// restarted, its PostgreSQL stopped) or run many runs in a row, then check
// the rules of docs/faults.md: nothing lost (a terminal report only after
// every output byte is acknowledged, else the bytes kept and a reason), one
// record per run, and recovery reaps what a fault left behind.
//
// The engine faults use a private dockerd the test starts as root, with its
// own data root, exec root and socket under a temporary directory; the
// machine's main dockerd is never touched. Those tests skip only when not
// root or when dockerd is missing: where both are there (as in CI) they
// run, and fail rather than skip when the engine does not come up.
//
// docs/faults.md lists every case of the fault catalog with the test that
// injects it, in this package or elsewhere; `make faults` runs them all.
//
// The package has no code of its own; its tests need the image
// taskrun/testbox:local (`make images`). `go test -short` skips them.
package faults
