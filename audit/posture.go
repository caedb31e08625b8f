// Package audit checks a container's isolation against the CIS Docker Benchmark
// 1.6.0 §5 (container runtime), the Kubernetes Pod Security Standards
// "restricted" profile mapped onto Docker fields, and taskrun's own stricter
// rules. The rules are pure functions over a Posture, the security-relevant
// subset of a `docker inspect` document, so a stored isolation record can be
// re-checked years later without a Docker daemon.
package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/docker/docker/api/types/container"

	"github.com/taskrun/taskrun/sandbox/seccomp"
)

// Posture is the security-relevant part of one container's `docker inspect`
// document, flattened and with stable JSON names so it can be stored.
type Posture struct {
	ID         string            `json:"id"`
	Name       string            `json:"name,omitempty"`
	Image      string            `json:"image,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	User       string            `json:"user"`
	WorkingDir string            `json:"working_dir,omitempty"`
	Privileged bool              `json:"privileged"`
	CapAdd     []string          `json:"cap_add,omitempty"`
	CapDrop    []string          `json:"cap_drop,omitempty"`
	// SecurityOpt lists the security options; an inline seccomp profile
	// appears as "seccomp=sha256:<hex>", the digest of its JSON.
	SecurityOpt     []string `json:"security_opt,omitempty"`
	AppArmorProfile string   `json:"apparmor_profile,omitempty"`
	ReadonlyRootfs  bool     `json:"readonly_rootfs"`
	Memory          int64    `json:"memory"`
	MemorySwap      int64    `json:"memory_swap"`
	NanoCPUs        int64    `json:"nano_cpus"`
	CPUQuota        int64    `json:"cpu_quota,omitempty"`
	// PidsLimit is nil when the inspect document has no limit at all.
	PidsLimit         *int64            `json:"pids_limit,omitempty"`
	NetworkMode       string            `json:"network_mode"`
	PidMode           string            `json:"pid_mode,omitempty"`
	IpcMode           string            `json:"ipc_mode,omitempty"`
	UTSMode           string            `json:"uts_mode,omitempty"`
	UsernsMode        string            `json:"userns_mode,omitempty"`
	Mounts            []Mount           `json:"mounts,omitempty"`
	Tmpfs             map[string]string `json:"tmpfs,omitempty"`
	Devices           []string          `json:"devices,omitempty"`
	DeviceCgroupRules []string          `json:"device_cgroup_rules,omitempty"`
	DeviceRequests    int               `json:"device_requests,omitempty"`
	// PortBindings lists "containerPort/proto->hostIP:hostPort" entries.
	PortBindings    []string          `json:"port_bindings,omitempty"`
	PublishAllPorts bool              `json:"publish_all_ports"`
	RestartPolicy   string            `json:"restart_policy,omitempty"`
	CgroupParent    string            `json:"cgroup_parent,omitempty"`
	MaskedPaths     []string          `json:"masked_paths,omitempty"`
	ReadonlyPaths   []string          `json:"readonly_paths,omitempty"`
	LogDriver       string            `json:"log_driver"`
	LogOpts         map[string]string `json:"log_opts,omitempty"`
	Runtime         string            `json:"runtime,omitempty"`
	Ulimits         []Ulimit          `json:"ulimits,omitempty"`
}

// Mount is one entry of the inspect document's Mounts list.
type Mount struct {
	// Type is "bind", "volume", "tmpfs", ...
	Type        string `json:"type"`
	Source      string `json:"source,omitempty"`
	Destination string `json:"destination"`
	RW          bool   `json:"rw"`
	Propagation string `json:"propagation,omitempty"`
}

// Ulimit is one resource limit set on the container.
type Ulimit struct {
	Name string `json:"name"`
	Soft int64  `json:"soft"`
	Hard int64  `json:"hard"`
}

// ErrIncompleteInspect is returned for an inspect document that lacks the
// HostConfig or Config sections every rule depends on.
var ErrIncompleteInspect = errors.New("inspect document has no HostConfig or Config")

// ParseInspect decodes the raw JSON of `docker inspect` for one container
// (an object, or an array holding exactly one object, as the CLI prints it).
func ParseInspect(raw []byte) (Posture, error) {
	trimmed := strings.TrimSpace(string(raw))
	if strings.HasPrefix(trimmed, "[") {
		var many []json.RawMessage
		if err := json.Unmarshal(raw, &many); err != nil {
			return Posture{}, fmt.Errorf("parse inspect array: %w", err)
		}
		if len(many) != 1 {
			return Posture{}, fmt.Errorf("parse inspect: got %d containers; pass exactly one", len(many))
		}
		raw = many[0]
	}
	var resp container.InspectResponse
	if err := json.Unmarshal(raw, &resp); err != nil {
		return Posture{}, fmt.Errorf("parse inspect: %w", err)
	}
	return FromInspect(resp)
}

// FromInspect extracts the Posture from a decoded inspect response.
func FromInspect(resp container.InspectResponse) (Posture, error) {
	if resp.ContainerJSONBase == nil || resp.HostConfig == nil || resp.Config == nil {
		return Posture{}, ErrIncompleteInspect
	}
	hc, cfg := resp.HostConfig, resp.Config
	p := Posture{
		ID:                resp.ID,
		Name:              strings.TrimPrefix(resp.Name, "/"),
		Image:             resp.Image,
		Labels:            cfg.Labels,
		User:              cfg.User,
		WorkingDir:        cfg.WorkingDir,
		Privileged:        hc.Privileged,
		CapAdd:            hc.CapAdd,
		CapDrop:           hc.CapDrop,
		SecurityOpt:       securityOptsByDigest(hc.SecurityOpt),
		AppArmorProfile:   resp.AppArmorProfile,
		ReadonlyRootfs:    hc.ReadonlyRootfs,
		Memory:            hc.Memory,
		MemorySwap:        hc.MemorySwap,
		NanoCPUs:          hc.NanoCPUs,
		CPUQuota:          hc.CPUQuota,
		PidsLimit:         hc.PidsLimit,
		NetworkMode:       string(hc.NetworkMode),
		PidMode:           string(hc.PidMode),
		IpcMode:           string(hc.IpcMode),
		UTSMode:           string(hc.UTSMode),
		UsernsMode:        string(hc.UsernsMode),
		Tmpfs:             hc.Tmpfs,
		DeviceCgroupRules: hc.DeviceCgroupRules,
		DeviceRequests:    len(hc.DeviceRequests),
		PublishAllPorts:   hc.PublishAllPorts,
		RestartPolicy:     string(hc.RestartPolicy.Name),
		CgroupParent:      hc.CgroupParent,
		MaskedPaths:       hc.MaskedPaths,
		ReadonlyPaths:     hc.ReadonlyPaths,
		LogDriver:         hc.LogConfig.Type,
		LogOpts:           hc.LogConfig.Config,
		Runtime:           hc.Runtime,
	}
	for _, m := range resp.Mounts {
		p.Mounts = append(p.Mounts, Mount{
			Type:        string(m.Type),
			Source:      m.Source,
			Destination: m.Destination,
			RW:          m.RW,
			Propagation: string(m.Propagation),
		})
	}
	for _, d := range hc.Devices {
		p.Devices = append(p.Devices, d.PathOnHost+":"+d.PathInContainer)
	}
	for port, bindings := range hc.PortBindings {
		for _, b := range bindings {
			p.PortBindings = append(p.PortBindings, fmt.Sprintf("%s->%s:%s", port, b.HostIP, b.HostPort))
		}
		if len(bindings) == 0 {
			p.PortBindings = append(p.PortBindings, string(port))
		}
	}
	sort.Strings(p.PortBindings)
	for _, u := range hc.Ulimits {
		if u != nil {
			p.Ulimits = append(p.Ulimits, Ulimit{Name: u.Name, Soft: u.Soft, Hard: u.Hard})
		}
	}
	return p, nil
}

// securityOptsByDigest replaces an inline seccomp profile (a JSON document of
// tens of KiB) by its digest, which names it exactly.
func securityOptsByDigest(opts []string) []string {
	if opts == nil {
		return nil
	}
	out := make([]string, len(opts))
	for i, o := range opts {
		out[i] = o
		for _, sep := range []string{"=", ":"} {
			if v, ok := strings.CutPrefix(o, "seccomp"+sep); ok && strings.HasPrefix(strings.TrimSpace(v), "{") {
				out[i] = "seccomp" + sep + seccomp.Digest([]byte(v))
			}
		}
	}
	return out
}
