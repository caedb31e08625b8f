package sandbox

import "fmt"

// Policy is the confinement applied to every container. DefaultPolicy holds the
// defaults of the design; any field set looser than the default is a loosening,
// listed by Loosenings and recorded with the run.
type Policy struct {
	// User is the uid[:gid] the process runs as. Never root by default.
	User string `json:"user"`
	// ReadOnlyRootfs mounts the image's root filesystem read-only.
	ReadOnlyRootfs bool `json:"read_only_rootfs"`
	// TmpfsSizeBytes caps the writable /tmp tmpfs (mounted nosuid,nodev; exec is
	// allowed because agents run what they build there).
	TmpfsSizeBytes int64 `json:"tmpfs_size_bytes"`
	// PidsLimit caps the number of processes; must be > 0.
	PidsLimit int64 `json:"pids_limit"`
	// MemoryBytes caps memory; swap is capped to the same value (no swap).
	MemoryBytes int64 `json:"memory_bytes"`
	// NanoCPUs caps CPU in billionths of a CPU.
	NanoCPUs int64 `json:"nano_cpus"`
	// NetworkMode is "none" by default.
	NetworkMode string `json:"network_mode"`
	// Runtime is the OCI runtime, "" for the engine default or "runsc" for gVisor.
	Runtime string `json:"runtime,omitempty"`
	// NoFile is the soft and hard limit on open files.
	NoFile int64 `json:"nofile"`
	// LogMaxSize caps the json-file log, e.g. "10m".
	LogMaxSize string `json:"log_max_size"`
	// LogMaxFile is how many rotated json-file logs are kept.
	LogMaxFile int `json:"log_max_file"`
}

// Default limits of the design.
const (
	DefaultUser           = "10001:10001"
	DefaultPidsLimit      = 256
	DefaultMemoryBytes    = 1 << 30
	DefaultNanoCPUs       = 1_000_000_000
	DefaultTmpfsSizeBytes = 64 << 20
	DefaultNoFile         = 1024
	DefaultLogMaxSize     = "10m"
	DefaultLogMaxFile     = 2
	NetworkNone           = "none"
	RuntimeGVisor         = "runsc"
	// RuntimeGVisorRestore is the engine runtime a gVisor sandbox restored
	// from a checkpoint runs under (cmd/taskrun-runsc-restore, in front of
	// runsc): a gVisor sandbox as well.
	RuntimeGVisorRestore = "taskrun-runsc-restore"
)

// DefaultPolicy returns the design's default confinement.
func DefaultPolicy() Policy {
	return Policy{
		User:           DefaultUser,
		ReadOnlyRootfs: true,
		TmpfsSizeBytes: DefaultTmpfsSizeBytes,
		PidsLimit:      DefaultPidsLimit,
		MemoryBytes:    DefaultMemoryBytes,
		NanoCPUs:       DefaultNanoCPUs,
		NetworkMode:    NetworkNone,
		NoFile:         DefaultNoFile,
		LogMaxSize:     DefaultLogMaxSize,
		LogMaxFile:     DefaultLogMaxFile,
	}
}

// Validate rejects a policy that would leave a limit unset or run as root.
func (p Policy) Validate() error {
	switch {
	case p.User == "" || p.User == "0" || p.User == "root" || len(p.User) > 1 && p.User[:2] == "0:":
		return fmt.Errorf("sandbox policy: user %q runs as root; use a non-zero uid such as %s", p.User, DefaultUser)
	case p.PidsLimit <= 0:
		return fmt.Errorf("sandbox policy: pids limit %d must be > 0 (set --pids)", p.PidsLimit)
	case p.MemoryBytes <= 0:
		return fmt.Errorf("sandbox policy: memory limit %d must be > 0 (set --memory)", p.MemoryBytes)
	case p.NanoCPUs <= 0:
		return fmt.Errorf("sandbox policy: cpu limit must be > 0 (set --cpus)")
	case p.NetworkMode == "host" || p.NetworkMode == "":
		return fmt.Errorf("sandbox policy: network mode %q is not allowed; use %q", p.NetworkMode, NetworkNone)
	case p.TmpfsSizeBytes <= 0:
		return fmt.Errorf("sandbox policy: /tmp size %d must be > 0", p.TmpfsSizeBytes)
	}
	return nil
}

// Loosenings lists, in words, every way p is looser than DefaultPolicy.
func (p Policy) Loosenings() []string {
	d := DefaultPolicy()
	var out []string
	add := func(cond bool, format string, args ...any) {
		if cond {
			out = append(out, fmt.Sprintf(format, args...))
		}
	}
	add(p.User != d.User, "user %q instead of %q", p.User, d.User)
	add(!p.ReadOnlyRootfs, "writable root filesystem")
	add(p.TmpfsSizeBytes > d.TmpfsSizeBytes, "/tmp %d bytes > %d", p.TmpfsSizeBytes, d.TmpfsSizeBytes)
	add(p.PidsLimit > d.PidsLimit, "pids limit %d > %d", p.PidsLimit, d.PidsLimit)
	add(p.MemoryBytes > d.MemoryBytes, "memory %d bytes > %d", p.MemoryBytes, d.MemoryBytes)
	add(p.NanoCPUs > d.NanoCPUs, "cpus %.2f > %.2f", float64(p.NanoCPUs)/1e9, float64(d.NanoCPUs)/1e9)
	add(p.NetworkMode != d.NetworkMode, "network %q instead of %q", p.NetworkMode, d.NetworkMode)
	add(p.NoFile > d.NoFile, "nofile %d > %d", p.NoFile, d.NoFile)
	return out
}
