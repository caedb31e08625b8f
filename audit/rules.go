package audit

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	units "github.com/docker/go-units"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/seccomp"
)

// rule is one check. Each unsafe setting is attributed to exactly one rule, so
// a container that breaks one thing fails exactly one rule.
type rule struct {
	id, source, title string
	check             func(c checkCtx) (Status, string)
}

type checkCtx struct {
	p    Posture
	host HostFacts
	opts Options
}

// Check evaluates every rule against p and returns one Finding per rule.
func Check(p Posture, host HostFacts, opts Options) Report {
	c := checkCtx{p: p, host: host, opts: opts.withDefaults()}
	r := Report{ContainerID: p.ID, Name: p.Name}
	for _, rl := range rules {
		st, why, gap := evaluate(rl, c)
		r.Findings = append(r.Findings, Finding{ID: rl.id, Source: rl.source, Title: rl.title, Status: st, Reason: why, Gap: gap})
	}
	return r
}

// RuleIDs lists the IDs of all rules in the order Check reports them.
func RuleIDs() []string {
	ids := make([]string, len(rules))
	for i, rl := range rules {
		ids[i] = rl.id
	}
	return ids
}

var rules = []rule{
	{"5.5", SourceCIS, "not privileged", checkPrivileged},
	{"5.4", SourceCIS, "no capabilities added (CapAdd empty)", checkCapAdd},
	{"PSS:capabilities-drop-all", SourcePSS, "capabilities.drop includes ALL", checkCapDrop},
	{"5.26", SourceCIS, "no-new-privileges set (PSS allowPrivilegeEscalation=false)", checkNoNewPrivs},
	{"5.22", SourceCIS, "seccomp profile not unconfined (PSS seccompProfile)", checkSeccomp},
	{"TR:seccomp-profile", SourceTaskrun, "taskrun's own seccomp profile (no io_uring, AF_VSOCK, userfaultfd, perf, bpf)", checkSeccompProfile},
	{"5.2", SourceCIS, "AppArmor profile applied", checkAppArmor},
	{"5.13", SourceCIS, "root filesystem read-only", checkReadonlyRootfs},
	{"5.11", SourceCIS, "memory limited (Memory > 0)", checkMemory},
	{"TR:no-swap", SourceTaskrun, "no swap beyond the memory limit (MemorySwap == Memory)", checkSwap},
	{"5.12", SourceCIS, "CPU limited (NanoCpus > 0)", checkCPU},
	{"5.29", SourceCIS, "PIDs limited (PidsLimit > 0)", checkPids},
	{"5.10", SourceCIS, "network mode isolated (PSS hostNetwork=false)", checkNetwork},
	{"TR:egress", SourceTaskrun, "with an egress policy, the proxy socket is the only route out", checkEgress},
	{"5.16", SourceCIS, "PID namespace private (PSS hostPID=false)", checkPidMode},
	{"5.17", SourceCIS, "IPC namespace private (PSS hostIPC=false)", checkIpcMode},
	{"5.21", SourceCIS, "UTS namespace private", checkUTSMode},
	{"5.31", SourceCIS, "user namespace not shared with host", checkUsernsMode},
	{"5.32", SourceCIS, "no container-runtime socket or /run mounted", checkSockets},
	{"5.6", SourceCIS, "no sensitive host directory mounted", checkSensitiveDirs},
	{"5.20", SourceCIS, "no shared mount propagation", checkPropagation},
	{"TR:only-run-mount", SourceTaskrun, "only the run's own dir, tmpfs and read-only helpers mounted (PSS hostPath)", checkOnlyRunMount},
	{"TR:tmpfs", SourceTaskrun, "every tmpfs mount nosuid, nodev and size-capped", checkTmpfs},
	{"5.18", SourceCIS, "no host devices", checkDevices},
	{"5.8", SourceCIS, "no published ports (PSS hostPort)", checkPorts},
	{"5.15", SourceCIS, "restart policy \"no\"", checkRestart},
	{"5.25", SourceCIS, "default cgroup parent", checkCgroupParent},
	{"PSS:runAsNonRoot", SourcePSS, "runs as a non-zero uid", checkUser},
	{"TR:proc-masking", SourceTaskrun, "MaskedPaths set and /proc/sys read-only (PSS procMount Default)", checkProcMasking},
	{"TR:log-capped", SourceTaskrun, "container log size capped", checkLogCapped},
	{"TR:gvisor", SourceTaskrun, "gVisor runtime (runsc) when required", checkGVisor},
	{"TR:workdir-not-proc", SourceTaskrun, "working dir not under /proc (CVE-2024-21626)", checkWorkdir},
	{"5.19", SourceCIS, "ulimits set deliberately", checkUlimits},
	{"PSS:namespace-restricted", SourcePSS, "the namespace enforces Pod Security \"restricted\" (Kubernetes)", checkNamespaceAdmission},
}

func pass(format string, args ...any) (Status, string) { return Pass, fmt.Sprintf(format, args...) }
func fail(format string, args ...any) (Status, string) { return Fail, fmt.Sprintf(format, args...) }
func na(format string, args ...any) (Status, string) {
	return NotApplicable, fmt.Sprintf(format, args...)
}

func checkPrivileged(c checkCtx) (Status, string) {
	if c.p.Privileged {
		return fail("Privileged is true: all capabilities, all devices, no masking")
	}
	return pass("Privileged is false")
}

func checkCapAdd(c checkCtx) (Status, string) {
	if len(c.p.CapAdd) > 0 {
		return fail("CapAdd is %v; add no capabilities", c.p.CapAdd)
	}
	return pass("CapAdd is empty")
}

func checkCapDrop(c checkCtx) (Status, string) {
	if slices.ContainsFunc(c.p.CapDrop, func(s string) bool { return strings.EqualFold(s, "ALL") }) {
		return pass("CapDrop contains ALL")
	}
	return fail("CapDrop is %v; it must contain ALL", c.p.CapDrop)
}

// securityOpt returns the value of a SecurityOpt key, accepting both the
// "key=value" and the legacy "key:value" forms; a bare "key" yields "true".
// When the key is given more than once the last one counts, as in the engine.
func securityOpt(opts []string, key string) (value string, found bool) {
	for _, o := range opts {
		if o == key {
			value, found = "true", true
			continue
		}
		for _, sep := range []string{"=", ":"} {
			if v, ok := strings.CutPrefix(o, key+sep); ok {
				value, found = v, true
				break
			}
		}
	}
	return value, found
}

func checkNoNewPrivs(c checkCtx) (Status, string) {
	v, ok := securityOpt(c.p.SecurityOpt, "no-new-privileges")
	if !ok {
		return fail("SecurityOpt %v lacks no-new-privileges", c.p.SecurityOpt)
	}
	if b, err := strconv.ParseBool(v); err != nil || !b {
		return fail("no-new-privileges is %q; set it to true", v)
	}
	return pass("no-new-privileges is set")
}

func checkSeccomp(c checkCtx) (Status, string) {
	v, ok := securityOpt(c.p.SecurityOpt, "seccomp")
	switch {
	case ok && v == "unconfined":
		return fail("SecurityOpt has seccomp=unconfined")
	case ok:
		return pass("custom seccomp profile set")
	case !c.host.Seccomp:
		return fail("no seccomp profile set and the daemon reports no seccomp support")
	}
	return pass("daemon default seccomp profile applies")
}

// checkSeccompProfile requires the profile named in the options, inline. An
// unconfined container also fails 5.22; the daemon's default profile passes
// 5.22 but fails here: it allows io_uring and, on older engines, AF_VSOCK.
func checkSeccompProfile(c checkCtx) (Status, string) {
	want := c.opts.SeccompProfile
	v, ok := securityOpt(c.p.SecurityOpt, "seccomp")
	if strings.HasPrefix(v, "{") {
		v = seccomp.Digest([]byte(v)) // a posture not built by FromInspect
	}
	switch {
	case !ok:
		return fail("no seccomp profile set, so the daemon's default applies; want %s (%s)", want.Name, want.SHA256)
	case v == "unconfined":
		return fail("seccomp is unconfined; want %s (%s)", want.Name, want.SHA256)
	case v != want.SHA256:
		return fail("seccomp profile %s is not %s (%s)", v, want.Name, want.SHA256)
	}
	return pass("seccomp profile %s (%s)", want.Name, want.SHA256)
}

func checkAppArmor(c checkCtx) (Status, string) {
	if !c.host.AppArmor {
		return na("host has no AppArmor (docker info SecurityOptions); not evaluated")
	}
	if v, ok := securityOpt(c.p.SecurityOpt, "apparmor"); ok && v == "unconfined" {
		return fail("SecurityOpt has apparmor=unconfined")
	}
	switch c.p.AppArmorProfile {
	case "", "unconfined", "[]", "<no value>":
		return fail("AppArmorProfile is %q", c.p.AppArmorProfile)
	}
	return pass("AppArmorProfile is %q", c.p.AppArmorProfile)
}

func checkReadonlyRootfs(c checkCtx) (Status, string) {
	if !c.p.ReadonlyRootfs {
		return fail("ReadonlyRootfs is false")
	}
	return pass("ReadonlyRootfs is true")
}

func checkMemory(c checkCtx) (Status, string) {
	if c.p.Memory <= 0 {
		return fail("Memory is %d (unlimited)", c.p.Memory)
	}
	return pass("Memory is %d bytes", c.p.Memory)
}

func checkSwap(c checkCtx) (Status, string) {
	if c.p.Memory <= 0 {
		return na("no memory limit (see 5.11)")
	}
	if c.p.MemorySwap != c.p.Memory {
		return fail("MemorySwap is %d, Memory is %d; set them equal", c.p.MemorySwap, c.p.Memory)
	}
	return pass("MemorySwap equals Memory (%d)", c.p.Memory)
}

func checkCPU(c checkCtx) (Status, string) {
	switch {
	case c.p.NanoCPUs > 0:
		return pass("NanoCpus is %d", c.p.NanoCPUs)
	case c.p.CPUQuota > 0:
		return pass("CpuQuota is %d", c.p.CPUQuota)
	}
	return fail("NanoCpus and CpuQuota are 0 (unlimited)")
}

func checkPids(c checkCtx) (Status, string) {
	if c.p.PidsLimit == nil {
		return fail("PidsLimit is unset (unlimited)")
	}
	if *c.p.PidsLimit <= 0 {
		return fail("PidsLimit is %d (unlimited)", *c.p.PidsLimit)
	}
	return pass("PidsLimit is %d", *c.p.PidsLimit)
}

func checkNetwork(c checkCtx) (Status, string) {
	if slices.Contains(c.opts.AllowedNetworkModes, c.p.NetworkMode) {
		return pass("NetworkMode is %q", c.p.NetworkMode)
	}
	return fail("NetworkMode is %q; allowed: %v", c.p.NetworkMode, c.opts.AllowedNetworkModes)
}

func checkPidMode(c checkCtx) (Status, string) {
	if c.p.PidMode == "host" || strings.HasPrefix(c.p.PidMode, "container:") {
		return fail("PidMode is %q; it shares another PID namespace", c.p.PidMode)
	}
	return pass("PidMode is %q (private)", c.p.PidMode)
}

func checkIpcMode(c checkCtx) (Status, string) {
	switch c.p.IpcMode {
	case "private", "none":
		return pass("IpcMode is %q", c.p.IpcMode)
	}
	return fail("IpcMode is %q; use private or none", c.p.IpcMode)
}

func checkUTSMode(c checkCtx) (Status, string) {
	if c.p.UTSMode == "host" {
		return fail("UTSMode is host")
	}
	return pass("UTSMode is %q (private)", c.p.UTSMode)
}

func checkUsernsMode(c checkCtx) (Status, string) {
	if strings.Contains(c.p.UsernsMode, "host") {
		return fail("UsernsMode is %q", c.p.UsernsMode)
	}
	return pass("UsernsMode is %q", c.p.UsernsMode)
}

func checkPropagation(c checkCtx) (Status, string) {
	var bad []string
	for _, m := range c.p.Mounts {
		if m.Propagation == "shared" || m.Propagation == "rshared" {
			bad = append(bad, fmt.Sprintf("%s (%s)", m.Destination, m.Propagation))
		}
	}
	if len(bad) > 0 {
		return fail("shared propagation on %s", strings.Join(bad, ", "))
	}
	return pass("no mount has shared propagation")
}

func checkDevices(c checkCtx) (Status, string) {
	switch {
	case len(c.p.Devices) > 0:
		return fail("Devices is %v", c.p.Devices)
	case c.p.DeviceRequests > 0:
		return fail("%d DeviceRequests (GPUs etc.)", c.p.DeviceRequests)
	case len(c.p.DeviceCgroupRules) > 0:
		return fail("DeviceCgroupRules is %v", c.p.DeviceCgroupRules)
	}
	return pass("no devices, device requests or device cgroup rules")
}

func checkPorts(c checkCtx) (Status, string) {
	switch {
	case len(c.p.PortBindings) > 0:
		return fail("PortBindings is %v", c.p.PortBindings)
	case c.p.PublishAllPorts:
		return fail("PublishAllPorts is true")
	}
	return pass("no port bindings")
}

func checkRestart(c checkCtx) (Status, string) {
	if c.p.RestartPolicy == "" || c.p.RestartPolicy == "no" {
		return pass("RestartPolicy is %q", c.p.RestartPolicy)
	}
	return fail("RestartPolicy is %q; a run must never restart", c.p.RestartPolicy)
}

func checkCgroupParent(c checkCtx) (Status, string) {
	if c.p.CgroupParent != "" {
		return fail("CgroupParent is %q", c.p.CgroupParent)
	}
	return pass("CgroupParent is empty")
}

func checkUser(c checkCtx) (Status, string) {
	uidPart, _, _ := strings.Cut(c.p.User, ":")
	if uidPart == "" {
		return fail("Config.User is empty: the image's user (often root) applies")
	}
	uid, err := strconv.ParseUint(uidPart, 10, 32)
	if err != nil {
		return fail("Config.User %q is a name that inspect cannot prove non-root; use a numeric uid", c.p.User)
	}
	if uid == 0 {
		return fail("Config.User %q is uid 0", c.p.User)
	}
	return pass("Config.User is %q", c.p.User)
}

func checkProcMasking(c checkCtx) (Status, string) {
	if len(c.p.MaskedPaths) == 0 {
		return fail("MaskedPaths is empty")
	}
	if !slices.Contains(c.p.ReadonlyPaths, "/proc/sys") {
		return fail("ReadonlyPaths %v lacks /proc/sys", c.p.ReadonlyPaths)
	}
	return pass("%d masked paths; /proc/sys read-only", len(c.p.MaskedPaths))
}

func checkLogCapped(c checkCtx) (Status, string) {
	switch c.p.LogDriver {
	case "local":
		return pass("log driver local (capped by default)")
	case "none":
		return pass("log driver none (nothing stored)")
	case "json-file":
		v, ok := c.p.LogOpts["max-size"]
		if !ok {
			return fail("json-file without max-size grows without bound")
		}
		n, err := units.FromHumanSize(v)
		if err != nil || n <= 0 {
			return fail("json-file max-size %q is not a positive size", v)
		}
		return pass("json-file max-size %s", v)
	}
	return fail("log driver %q is not known to be capped; use json-file with max-size or local", c.p.LogDriver)
}

// checkNamespaceAdmission: a Docker container has no namespace admission;
// the executor's own policy is what the other rules check.
func checkNamespaceAdmission(checkCtx) (Status, string) {
	return na("a Docker container is admitted by no cluster; the other rules check its configuration")
}

func checkGVisor(c checkCtx) (Status, string) {
	rt := c.p.Runtime
	if rt == "" {
		rt = "engine default"
	}
	if !c.opts.RequireGVisor {
		return na("runtime %s recorded; gVisor not required", rt)
	}
	switch c.p.Runtime {
	case sandbox.RuntimeGVisor:
		return pass("runtime is runsc")
	case sandbox.RuntimeGVisorRestore:
		return pass("runtime is %s: runsc restoring the run's checkpoint", rt)
	}
	return fail("runtime is %s; gVisor (runsc) is required", rt)
}

func checkWorkdir(c checkCtx) (Status, string) {
	wd := path.Clean("/" + c.p.WorkingDir)
	if wd == "/proc" || strings.HasPrefix(wd, "/proc/") {
		return fail("WorkingDir %q is under /proc", c.p.WorkingDir)
	}
	return pass("WorkingDir is %q", c.p.WorkingDir)
}

func checkUlimits(c checkCtx) (Status, string) {
	var missing []string
	for _, name := range c.opts.RequiredUlimits {
		if !slices.ContainsFunc(c.p.Ulimits, func(u Ulimit) bool { return u.Name == name }) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fail("ulimits %v not set (set: %v)", missing, c.p.Ulimits)
	}
	return pass("ulimits %v set", c.opts.RequiredUlimits)
}
