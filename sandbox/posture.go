package sandbox

// Posture is how one live container is confined, as its backend reports it:
// the facts audit rules check and the isolation record stores. The names are
// stable JSON, so a stored record can be re-checked without the backend.
// The Docker backend reads it from the engine's inspect document; other
// backends fill it from what they enforce.
type Posture struct {
	// Backend names the kind of sandbox backend that made the container:
	// BackendDocker (also when empty, as in records written before the field
	// existed) or BackendKubernetes. The audit evaluates each rule the way
	// that backend enforces it.
	Backend    string            `json:"backend,omitempty"`
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
	Mounts            []PostureMount    `json:"mounts,omitempty"`
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
	// ProcMount is a Pod container's procMount ("Default" or "Unmasked");
	// empty for Docker, whose masks are MaskedPaths and ReadonlyPaths.
	ProcMount string `json:"proc_mount,omitempty"`
	// EphemeralStorage is a Pod container's ephemeral-storage limit in
	// bytes (its writable layer, emptyDir volumes on disk and its log), 0
	// when unlimited or not a Pod.
	EphemeralStorage int64 `json:"ephemeral_storage,omitempty"`
	// ServiceAccountToken is true when a Pod mounts a service account token
	// (automountServiceAccountToken not false, or a projected token).
	ServiceAccountToken bool `json:"service_account_token,omitempty"`
	// NetworkPolicy is the NetworkPolicy the Kubernetes backend made for
	// the Pod, nil when there is none (or not a Pod).
	NetworkPolicy *PostureNetworkPolicy `json:"network_policy,omitempty"`
	// PodSecurity is the Pod Security Admission level the Pod's namespace
	// enforces (its pod-security.kubernetes.io/enforce label, "" when it
	// has none); nil when not a Pod or when the namespace could not be read.
	PodSecurity *string `json:"pod_security,omitempty"`
	// Gaps are the protections the backend declares it cannot enforce or
	// cannot observe, each named by the audit rule it leaves unmet. The
	// audit reports such a rule NOT_APPLICABLE with the gap's reason, and
	// the isolation record lists it; a rule that does not apply to a
	// backend without a declared gap fails.
	Gaps []Gap `json:"gaps,omitempty"`
}

// Backend kinds a Posture names.
const (
	// BackendDocker is a container of a Docker engine.
	BackendDocker = "docker"
	// BackendKubernetes is the run container of a Kubernetes Pod.
	BackendKubernetes = "kubernetes"
)

// Kind is the posture's backend kind; an empty Backend is Docker.
func (p Posture) Kind() string {
	if p.Backend == "" {
		return BackendDocker
	}
	return p.Backend
}

// PostureNetworkPolicy is what a NetworkPolicy says, as the audit reads it.
type PostureNetworkPolicy struct {
	Name string `json:"name"`
	// PodSelector is the policy's podSelector.matchLabels.
	PodSelector map[string]string `json:"pod_selector,omitempty"`
	// SelectorExpressions counts podSelector.matchExpressions.
	SelectorExpressions int `json:"selector_expressions,omitempty"`
	// PolicyTypes are "Ingress" and/or "Egress".
	PolicyTypes []string `json:"policy_types,omitempty"`
	// IngressRules and EgressRules count the rules allowing traffic.
	IngressRules int `json:"ingress_rules"`
	EgressRules  int `json:"egress_rules"`
}

// Gap is one protection a backend declares it does not enforce (or cannot
// see enforced), named by the audit rule that would check it.
type Gap struct {
	// Rule is the audit rule's ID, e.g. "5.29".
	Rule string `json:"rule"`
	// Reason says why the backend cannot enforce or observe it, and what
	// bounds the risk instead.
	Reason string `json:"reason"`
}

// Kinder is implemented by a Backend that names its kind (BackendDocker,
// BackendKubernetes); a backend without it is taken for Docker.
type Kinder interface {
	Kind() string
}

// PostureMount is one filesystem mounted into a live container.
type PostureMount struct {
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

// HostFacts is what the audit needs to know about the host a backend runs
// containers on (for Docker: the daemon's `docker info`).
type HostFacts struct {
	// AppArmor is true when the daemon reports an AppArmor security option.
	AppArmor bool `json:"apparmor"`
	// Seccomp is true when the daemon reports seccomp support.
	Seccomp bool `json:"seccomp"`
	// SELinux is true when the daemon runs with SELinux enabled.
	SELinux bool `json:"selinux"`
	// Rootless is true for a rootless daemon.
	Rootless bool `json:"rootless"`
	// ServerVersion is the engine version.
	ServerVersion string `json:"server_version,omitempty"`
	// Runtimes are the container runtimes the engine offers, sorted
	// (e.g. "runc", "runsc").
	Runtimes []string `json:"runtimes,omitempty"`
}
