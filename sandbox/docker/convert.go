package docker

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/seccomp"
)

// The dev.taskrun.* labels, defined in package sandbox.
//
// Deprecated: use the sandbox.Label* constants.
const (
	LabelManaged = sandbox.LabelManaged
	LabelTenant  = sandbox.LabelTenant
	LabelTask    = sandbox.LabelTask
	LabelRun     = sandbox.LabelRun
	LabelCreated = sandbox.LabelCreated
	LabelExpires = sandbox.LabelExpires
)

// TmpfsPath is where the size-capped writable tmpfs is mounted.
//
// It is mounted nosuid and nodev but explicitly exec (the engine's default for
// a tmpfs is noexec): agents build and run binaries under /tmp (`go test`
// executes its test binary from $TMPDIR, pip and npm run build helpers from
// there), and noexec would buy little because the bind-mounted run directory
// (/taskrun) is writable and executable anyway. The root filesystem stays
// read-only, no capability is kept and no-new-privileges is set, so an
// executable in /tmp gains nothing a script could not do.
const TmpfsPath = "/tmp"

// createConfig is everything ContainerCreate needs.
type createConfig struct {
	Name    string
	Config  *container.Config
	Host    *container.HostConfig
	Network *network.NetworkingConfig
}

// convert maps a Spec and Policy to the Docker create request. It is pure:
// created is the creation time recorded in the labels and slack is the margin
// added to the expiry label. spec.StopGrace must already hold the effective
// grace period and a Wrapper must already be resolved (wrapCommand).
func convert(spec sandbox.Spec, pol sandbox.Policy, created time.Time, slack time.Duration) createConfig {
	stopSeconds := graceSeconds(spec.StopGrace)
	cfg := &container.Config{
		User:         pol.User,
		Env:          spec.Env,
		Cmd:          spec.Cmd,
		Entrypoint:   spec.Entrypoint,
		Image:        spec.Image,
		WorkingDir:   spec.WorkingDir,
		Labels:       labels(spec, created, slack),
		AttachStdout: true,
		AttachStderr: true,
		StopTimeout:  &stopSeconds,
	}
	init := true
	pids := pol.PidsLimit
	host := &container.HostConfig{
		NetworkMode:     container.NetworkMode(pol.NetworkMode),
		RestartPolicy:   container.RestartPolicy{Name: container.RestartPolicyDisabled},
		AutoRemove:      false,
		CapDrop:         []string{"ALL"},
		IpcMode:         container.IPCModePrivate,
		Privileged:      false,
		PublishAllPorts: false,
		ReadonlyRootfs:  pol.ReadOnlyRootfs,
		SecurityOpt:     []string{"no-new-privileges", seccomp.SecurityOpt()},
		MaskedPaths:     MaskedPaths(),
		Tmpfs:           map[string]string{TmpfsPath: tmpfsOptions(pol.TmpfsSizeBytes)},
		Runtime:         pol.Runtime,
		Init:            &init,
		Mounts:          mounts(spec.Mounts),
		LogConfig:       logConfig(pol),
		Resources: container.Resources{
			Memory:     pol.MemoryBytes,
			MemorySwap: pol.MemoryBytes,
			NanoCPUs:   pol.NanoCPUs,
			PidsLimit:  &pids,
			Ulimits: []*container.Ulimit{
				{Name: "nofile", Soft: pol.NoFile, Hard: pol.NoFile},
				{Name: "core", Soft: 0, Hard: 0},
			},
		},
	}
	return createConfig{
		Name:    spec.Name,
		Config:  cfg,
		Host:    host,
		Network: &network.NetworkingConfig{},
	}
}

// dockerMaskedPaths are the paths Docker masks in a container by default
// (github.com/moby/moby oci.DefaultSpec); a container given MaskedPaths of
// its own gets only those, so they are repeated here.
var dockerMaskedPaths = []string{
	"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
	"/sys/firmware", "/sys/devices/virtual/powercap",
}

// hostActivityPaths show, under runc, what the host's other runs do: every
// block device's I/O counters (/proc/diskstats) and the host's block
// devices, loop devices among them, with their backing files (/sys/block,
// /sys/devices/virtual/block). runc masks a file with /dev/null and a
// directory with an empty read-only tmpfs; gVisor shows none of them anyway.
var hostActivityPaths = []string{"/proc/diskstats", "/sys/block", "/sys/devices/virtual/block"}

// MaskedPaths are the paths masked in every run container: Docker's
// default ones and hostActivityPaths.
func MaskedPaths() []string {
	return append(slices.Clone(dockerMaskedPaths), hostActivityPaths...)
}

// labels merges the Spec's labels with the dev.taskrun.* labels, which win.
func labels(spec sandbox.Spec, created time.Time, slack time.Duration) map[string]string {
	out := make(map[string]string, len(spec.Labels)+6)
	maps.Copy(out, spec.Labels)
	out[sandbox.LabelManaged] = "true"
	out[sandbox.LabelTenant] = spec.Run.UserID
	out[sandbox.LabelConversation] = spec.Run.ConversationID
	out[sandbox.LabelTask] = spec.Run.TaskID
	out[sandbox.LabelRun] = spec.Run.RunID
	out[sandbox.LabelCreated] = created.UTC().Format(time.RFC3339)
	if spec.Timeout > 0 {
		expires := created.Add(spec.Timeout + spec.StopGrace + slack)
		out[sandbox.LabelExpires] = expires.UTC().Format(time.RFC3339)
	}
	return out
}

// tmpfsOptions are the mount options of the /tmp tmpfs (see TmpfsPath).
func tmpfsOptions(size int64) string {
	return fmt.Sprintf("rw,exec,nosuid,nodev,size=%d", size)
}

// mounts turns the Spec's mounts into bind mounts with private propagation, so
// that no mount made on either side later shows up on the other.
func mounts(ms []sandbox.Mount) []mount.Mount {
	if len(ms) == 0 {
		return nil
	}
	out := make([]mount.Mount, 0, len(ms))
	for _, m := range ms {
		out = append(out, mount.Mount{
			Type:        mount.TypeBind,
			Source:      m.Source,
			Target:      m.Target,
			ReadOnly:    m.ReadOnly,
			BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate},
		})
	}
	return out
}

// logConfig caps the json-file log the engine keeps next to the attach stream.
func logConfig(pol sandbox.Policy) container.LogConfig {
	return container.LogConfig{
		Type: "json-file",
		Config: map[string]string{
			"max-size": pol.LogMaxSize,
			"max-file": strconv.Itoa(pol.LogMaxFile),
		},
	}
}

// graceSeconds rounds a grace period up to whole seconds, at least one.
func graceSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// validateSpec rejects a Spec the engine would misinterpret.
func validateSpec(spec sandbox.Spec) error {
	if spec.Image == "" {
		return fmt.Errorf("sandbox spec: image is empty; set Spec.Image to a local image such as taskrun/testbox:local")
	}
	for _, m := range spec.Mounts {
		if !isAbs(m.Source) || !isAbs(m.Target) {
			return fmt.Errorf("sandbox spec: mount %q -> %q: both paths must be absolute", m.Source, m.Target)
		}
	}
	return nil
}

// wrapCommand resolves the command the container would run without a wrapper,
// as Docker does (an Entrypoint set in the Spec drops the image's Cmd), and
// returns spec with Wrapper as the entrypoint and that command as arguments.
func wrapCommand(spec sandbox.Spec, imageEntrypoint, imageCmd []string) (sandbox.Spec, error) {
	ep, cmd := imageEntrypoint, imageCmd
	switch {
	case len(spec.Entrypoint) > 0:
		ep, cmd = spec.Entrypoint, spec.Cmd
	case len(spec.Cmd) > 0:
		cmd = spec.Cmd
	}
	argv := append(slices.Clone(ep), cmd...)
	if len(argv) == 0 {
		return spec, fmt.Errorf("sandbox spec: image %q has no command to run; give one after `--`", spec.Image)
	}
	spec.Entrypoint = slices.Clone(spec.Wrapper)
	spec.Cmd = argv
	spec.Wrapper = nil
	return spec, nil
}

// isAbs reports whether p is an absolute POSIX path.
func isAbs(p string) bool { return len(p) > 0 && p[0] == '/' }
