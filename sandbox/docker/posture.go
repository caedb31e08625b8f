package docker

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/system"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/seccomp"
)

// ErrIncompleteInspect is returned by PostureFromInspect for an inspect document that lacks the
// HostConfig or Config sections every rule depends on.
var ErrIncompleteInspect = errors.New("inspect document has no HostConfig or Config")

// securityOptsByDigest replaces an inline seccomp profile (a JSON document of
// kilobytes) by its digest ("seccomp=sha256:<hex>"), which names it exactly.
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

// PostureFromInspect extracts the container's posture from the engine's
// inspect response; the one place a Docker inspect document becomes facts.
func PostureFromInspect(resp container.InspectResponse) (sandbox.Posture, error) {
	if resp.ContainerJSONBase == nil || resp.HostConfig == nil || resp.Config == nil {
		return sandbox.Posture{}, ErrIncompleteInspect
	}
	hc, cfg := resp.HostConfig, resp.Config
	p := sandbox.Posture{
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
		p.Mounts = append(p.Mounts, sandbox.PostureMount{
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
			p.Ulimits = append(p.Ulimits, sandbox.Ulimit{Name: u.Name, Soft: u.Soft, Hard: u.Hard})
		}
	}
	return p, nil
}

// HostFactsFromInfo derives the host facts from `docker info`.
func HostFactsFromInfo(info system.Info) sandbox.HostFacts {
	h := sandbox.HostFacts{ServerVersion: info.ServerVersion}
	for name := range info.Runtimes {
		h.Runtimes = append(h.Runtimes, name)
	}
	sort.Strings(h.Runtimes)
	for _, opt := range info.SecurityOptions {
		name := opt
		// Since API 1.26 the entries are "name=seccomp,profile=default".
		if rest, ok := strings.CutPrefix(opt, "name="); ok {
			name, _, _ = strings.Cut(rest, ",")
		}
		switch name {
		case "apparmor":
			h.AppArmor = true
		case "seccomp":
			h.Seccomp = true
		case "selinux":
			h.SELinux = true
		case "rootless":
			h.Rootless = true
		}
	}
	return h
}
