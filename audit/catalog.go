package audit

// RuleInfo describes one rule of the table Check evaluates, for people
// reading an isolation record: what it requires and what it protects against.
type RuleInfo struct {
	ID     string `json:"id"`
	Source string `json:"source"`
	// Title says what the rule requires.
	Title string `json:"title"`
	// Protects says what the rule protects the host and other tenants from.
	Protects string `json:"protects"`
}

// Rules lists every rule in the order Check reports them.
func Rules() []RuleInfo {
	out := make([]RuleInfo, len(rules))
	for i, rl := range rules {
		out[i] = RuleInfo{ID: rl.id, Source: rl.source, Title: rl.title, Protects: protections[rl.id]}
	}
	return out
}

// protections says, per rule ID, what the rule protects against. Every rule
// of the table has an entry (a test checks it).
var protections = map[string]string{
	"5.5":                       "a privileged container has every capability and every host device: root in it is root on the host",
	"5.4":                       "added capabilities (SYS_ADMIN, NET_ADMIN, SYS_PTRACE...) give the agent kernel powers that break out of the container",
	"PSS:capabilities-drop-all": "default capabilities (CHOWN, NET_RAW, SETUID...) let the agent spoof packets or change file ownership in the mounted run dir",
	"5.26":                      "setuid binaries in the image could raise the agent's privileges after start",
	"5.22":                      "without seccomp every system call reaches the kernel, including the rarely used ones behind most container escapes",
	"TR:seccomp-profile":        "io_uring, AF_VSOCK, userfaultfd, perf and bpf are large kernel attack surfaces an agent never needs",
	"5.2":                       "AppArmor confines file access and mounts even when another layer fails",
	"5.13":                      "a writable root filesystem lets the agent replace the image's binaries and persist between processes of the run",
	"5.11":                      "an agent without a memory limit can exhaust the host's memory and get other tenants' runs killed",
	"TR:no-swap":                "swap beyond the memory limit lets a run push the host and other runs into swapping",
	"5.12":                      "an agent without a CPU limit can starve other tenants' runs and the executor",
	"5.29":                      "a fork bomb exhausts the host's process table",
	"5.10":                      "a network connection lets the agent exfiltrate data or reach the metadata service, the host and private networks",
	"TR:egress":                 "with an egress policy, any route other than the proxy bypasses the policy and its record",
	"5.16":                      "the host's PID namespace shows and lets the agent signal the host's and other runs' processes",
	"5.17":                      "the host's IPC namespace exposes shared memory of other processes",
	"5.21":                      "the host's UTS namespace lets the agent change the host's name",
	"5.31":                      "sharing the host's user namespace undoes uid remapping",
	"5.32":                      "a Docker or containerd socket in the container is root on the host",
	"5.6":                       "host directories (/, /etc, /proc, /sys...) leak secrets or give write access to the host",
	"5.20":                      "shared mount propagation lets mounts made in the container appear on the host",
	"TR:only-run-mount":         "any mount beyond the run's own dir exposes files of the host or of other runs",
	"TR:tmpfs":                  "an uncapped tmpfs fills the host's memory; suid or device files on it raise privileges",
	"5.18":                      "host devices give direct access to disks, GPUs or the console",
	"5.8":                       "published ports expose the agent's servers on the host's network",
	"5.15":                      "a restarting container outlives the run and its supervision",
	"5.25":                      "a custom cgroup parent escapes the limits the executor set",
	"PSS:runAsNonRoot":          "root in the container is one kernel bug away from root on the host, and owns the mounted run dir's files",
	"TR:proc-masking":           "unmasked /proc and writable /proc/sys expose kernel settings and host information",
	"TR:log-capped":             "uncapped container logs fill the host's disk",
	"TR:gvisor":                 "where required, gVisor puts a user-space kernel between the agent and the host kernel",
	"TR:workdir-not-proc":       "a working directory under /proc/self/fd leaks a host file descriptor into the container (CVE-2024-21626)",
	"PSS:namespace-restricted":  "a namespace that does not enforce \"restricted\" admits any Pod beside the run's, privileged or on the host's network, and nothing refuses a loosened run Pod",
	"5.19":                      "without explicit ulimits the agent inherits the daemon's, e.g. unlimited core dumps that fill the disk",
}
