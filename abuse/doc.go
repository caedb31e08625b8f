// Package abuse is taskrun's abuse suite: every test runs a real hostile
// workload through taskrun.Execute, in a real container on the local Docker
// engine with the in-sandbox self-check, and shows two things at once: the
// host is unharmed, and the run's result is right (status, reason, exit code
// and what was stored).
//
// The workloads are those a malicious or broken agent would run: a fork
// bomb, a memory bomb, filling /tmp and the run directory, flooding stdout
// and the container log, network egress to an IP, DNS and the cloud metadata
// address, symlinks and FIFOs planted in the outputs, looking for the Docker
// socket, writing /proc/sys, reading the executor's secrets, path traversal
// through IDs, a process that ignores SIGTERM, flooding the host-side
// records, sparse and hard-linked files in the outputs, a fallocate far past
// the disk cap of a kept run, file names no store can take and forging an
// earlier run's trace and gateway record. Each test names the
// protection it proves in its comment and fails if that protection is
// removed. Some cases are repeated under gVisor (runtime runsc) when the
// engine has it.
//
// The package has no code of its own; its tests need a Docker engine, the
// image taskrun/testbox:local (`make images`) and root on the host (they
// read the container's cgroup and log files). `go test -short` skips them.
package abuse
