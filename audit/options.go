package audit

import (
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/seccomp"
)

// The labels the audit reads, defined in package sandbox.
//
// Deprecated: use sandbox.LabelManaged, sandbox.LabelRun and
// sandbox.LabelRunDir.
const (
	LabelManaged = sandbox.LabelManaged
	LabelRun     = sandbox.LabelRun
	LabelRunDir  = sandbox.LabelRunDir
)

// The in-container paths the audit checks, defined in package model.
const (
	// RunDirTarget is where the run's own directory is bind-mounted.
	RunDirTarget = model.ContainerRunDir
	// HelperTarget is the directory under which read-only helper binaries
	// (such as taskrun-probe) may be bind-mounted. Their host sources must
	// not lie in a sensitive tree such as /usr (rule 5.6): taskrun mounts a
	// private copy of itself, or files of a dedicated helpers directory.
	HelperTarget = model.ContainerHelpersDir
)

// HostFacts is what the audit needs to know about the host
// (sandbox.HostFacts).
type HostFacts = sandbox.HostFacts

// Options tune the rules that depend on deployment policy. The zero value
// means the design's defaults (see DefaultOptions).
type Options struct {
	// AllowedNetworkModes are the network modes rule 5.10 accepts.
	// Empty means only "none".
	AllowedNetworkModes []string `json:"allowed_network_modes,omitempty"`
	// Mounts is the allowed-mount policy of rule TR:only-run-mount.
	Mounts MountPolicy `json:"mounts"`
	// RequireGVisor makes rule TR:gvisor demand the runsc runtime; otherwise
	// the rule is NOT_APPLICABLE and only records the runtime.
	RequireGVisor bool `json:"require_gvisor,omitempty"`
	// RequiredUlimits are the ulimit names rule 5.19 requires.
	// Empty means nofile and core.
	RequiredUlimits []string `json:"required_ulimits,omitempty"`
	// SeccompProfile is the seccomp profile rule TR:seccomp-profile requires.
	// Empty means taskrun's own profile (package sandbox/seccomp).
	SeccompProfile SeccompProfile `json:"seccomp_profile"`
}

// SeccompProfile names a seccomp profile: a name for people and the digest
// ("sha256:<hex>") of its JSON document, which is what the rule compares.
type SeccompProfile struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// TaskrunSeccompProfile names the profile every taskrun run container gets.
func TaskrunSeccompProfile() SeccompProfile {
	return SeccompProfile{Name: seccomp.Name, SHA256: seccomp.SHA256()}
}

// MountPolicy says which mounts a run container may have: the run's own dir
// at RunDirTarget, read-only helpers under HelperTarget, and tmpfs mounts.
// Everything else fails.
type MountPolicy struct {
	// RunDir is the exact host path expected at RunDirTarget. When empty it
	// is derived from the container's labels: LabelRunDir, but only when
	// RunsRoot is set and the label names a path strictly below it;
	// otherwise the source's last element must equal LabelRun.
	RunDir string `json:"run_dir,omitempty"`
	// RunsRoot, when set, is a host directory the run dir must lie strictly
	// below (RunsRoot itself, holding every run, is rejected).
	RunsRoot string `json:"runs_root,omitempty"`
	// ForbidHelpers rejects the read-only bind mounts under HelperTarget
	// that are otherwise allowed.
	ForbidHelpers bool `json:"forbid_helpers,omitempty"`
	// HelpersDir, when set, is the host directory helper mounts must come
	// from: each bind mount under HelperTarget must have it, or a path below
	// it, as its source. When empty any non-sensitive host path is accepted
	// as a helper source (rule 5.6 still rejects sensitive trees); helpers
	// must be read-only either way.
	HelpersDir string `json:"helpers_dir,omitempty"`
	// HelperFiles, when set, pins the helper mounts exactly: each bind mount
	// under HelperTarget must be one of its keys (in-container paths) with
	// the host file of that key as its source.
	HelperFiles map[string]string `json:"helper_files,omitempty"`
}

// DefaultOptions returns the design's policy: network none, helpers allowed,
// no gVisor requirement, nofile and core ulimits required, taskrun's seccomp
// profile.
func DefaultOptions() Options {
	return Options{
		AllowedNetworkModes: []string{"none"},
		RequiredUlimits:     []string{"nofile", "core"},
		SeccompProfile:      TaskrunSeccompProfile(),
	}
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if len(o.AllowedNetworkModes) == 0 {
		o.AllowedNetworkModes = d.AllowedNetworkModes
	}
	if len(o.RequiredUlimits) == 0 {
		o.RequiredUlimits = d.RequiredUlimits
	}
	if o.SeccompProfile.SHA256 == "" {
		o.SeccompProfile = d.SeccompProfile
	}
	return o
}
