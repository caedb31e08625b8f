package probe

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/taskrun/taskrun/model"
)

// Config tunes Collect. The zero value uses the defaults below.
type Config struct {
	// TCPTarget is an IP:port the TCP egress probe connects to (no payload).
	TCPTarget string
	// MetadataTarget is the cloud metadata endpoint probed.
	MetadataTarget string
	// DNSName is the name the DNS probe resolves.
	DNSName string
	// EgressTimeout bounds each egress probe.
	EgressTimeout time.Duration
	// WalkRoot is where the socket walk starts.
	WalkRoot string
	// RunDir is the agent-controlled run dir, left out of the walk so that
	// filling it cannot exhaust MaxWalkEntries. Sockets mounted there are
	// still found through the mount targets. Default DefaultRunDir.
	RunDir string
	// MaxWalkEntries bounds the socket walk.
	MaxWalkEntries int
	// SocketTimeout bounds each Docker GET /info attempt.
	SocketTimeout time.Duration
	// Parked, when set, is what the self-check observed when its container
	// parked at the gate (package warmpool), with nothing else run in it
	// since. Its egress attempts and its walk of the filesystem for sockets
	// are reused (the network and the read-only root cannot have changed);
	// the mount targets and the well-known socket paths are checked again,
	// and everything else is observed anew.
	Parked *Report
	// SkipEgress leaves out the egress probes (Expectation.SkipEgressProbes).
	SkipEgress bool
	// Reach are the addresses probed for Report.Reach
	// (Expectation.Unreachable); they are probed anew also when Parked is
	// set.
	Reach []ReachTarget
	// TokenPaths are where a Kubernetes service account token would be
	// mounted. Default ServiceAccountTokenPaths.
	TokenPaths []string
}

// ServiceAccountTokenPaths are where Kubernetes mounts a Pod's service
// account token.
var ServiceAccountTokenPaths = []string{
	"/var/run/secrets/kubernetes.io/serviceaccount/token",
	"/run/secrets/kubernetes.io/serviceaccount/token",
}

// Defaults of Config.
const (
	DefaultTCPTarget      = "1.1.1.1:443"
	DefaultMetadataTarget = "169.254.169.254:80"
	DefaultDNSName        = "example.com"
	DefaultEgressTimeout  = 2 * time.Second
	DefaultMaxWalkEntries = 20000
	DefaultRunDir         = model.ContainerRunDir
	DefaultSocketTimeout  = time.Second
)

func (c Config) withDefaults() Config {
	if c.TCPTarget == "" {
		c.TCPTarget = DefaultTCPTarget
	}
	if c.MetadataTarget == "" {
		c.MetadataTarget = DefaultMetadataTarget
	}
	if c.DNSName == "" {
		c.DNSName = DefaultDNSName
	}
	if c.EgressTimeout <= 0 {
		c.EgressTimeout = DefaultEgressTimeout
	}
	if c.WalkRoot == "" {
		c.WalkRoot = "/"
	}
	if c.RunDir == "" {
		c.RunDir = DefaultRunDir
	}
	if c.MaxWalkEntries <= 0 {
		c.MaxWalkEntries = DefaultMaxWalkEntries
	}
	if c.SocketTimeout <= 0 {
		c.SocketTimeout = DefaultSocketTimeout
	}
	if len(c.TokenPaths) == 0 {
		c.TokenPaths = ServiceAccountTokenPaths
	}
	return c
}

// Collect observes the sandbox it runs in. Failures to observe something are
// listed in Report.Errors and leave that field Unknown (or false).
func Collect(ctx context.Context, nonce string, cfg Config) Report {
	cfg = cfg.withDefaults()
	r := Report{Nonce: nonce, NoNewPrivs: Unknown, Seccomp: Unknown, PidsMax: Unknown, MemoryLimit: Unknown}
	var err error
	note := func(err error) {
		if err != nil {
			r.Errors = append(r.Errors, err.Error())
		}
	}
	note(collectStatus(&r))
	note(collectMounts(&r))
	r.RootfsWriteError = tryCreate("/", nonce)
	r.PidsMax, _ = readFirstLimit(&r, "/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max")
	r.MemoryLimit, _ = readFirstLimit(&r, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max")
	if b, err := os.ReadFile("/proc/self/attr/current"); err == nil {
		r.AppArmor = strings.TrimSpace(strings.TrimRight(string(b), "\x00"))
	}
	r.Interfaces, err = upInterfaces()
	note(err)
	for _, p := range cfg.TokenPaths {
		if _, err := os.Lstat(p); err == nil {
			r.ServiceAccountTokens = append(r.ServiceAccountTokens, p)
		}
	}
	if len(cfg.Reach) > 0 {
		r.Reach = probeReach(ctx, cfg, cfg.Reach)
	}
	if cfg.Parked != nil {
		r.Egress = cfg.Parked.Egress
		r.UnixSockets, r.DockerSockets, r.SocketSearchComplete = reuseSockets(ctx, cfg, r.Mounts, cfg.Parked)
		r.ParkedAt = cfg.Parked.CollectedAt
		r.CollectedAt = time.Now().UTC()
		return r
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if !cfg.SkipEgress {
			r.Egress = probeEgress(ctx, cfg)
		}
	}()
	var sockets, docker []string
	var walkErr error
	go func() { defer wg.Done(); sockets, docker, walkErr = findDockerSockets(ctx, cfg, r.Mounts) }()
	wg.Wait()
	r.UnixSockets, r.DockerSockets = sockets, docker
	r.SocketSearchComplete = walkErr == nil
	note(walkErr)
	r.CollectedAt = time.Now().UTC()
	return r
}

func collectStatus(r *Report) error {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return err
	}
	defer f.Close()
	if gs, err := os.Getgroups(); err == nil {
		r.Groups = gs
	}
	return applyStatus(r, f)
}

func collectMounts(r *Report) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	mounts, err := parseMountinfo(f)
	if err != nil {
		return err
	}
	r.Mounts = mounts
	if m, ok := mountAt(mounts, "/"); ok {
		r.RootfsReadOnly = m.ReadOnly
	}
	if m, ok := mountAt(mounts, "/proc/sys"); ok {
		r.ProcSysReadOnly = m.ReadOnly
	}
	return nil
}

// upInterfaces lists the non-loopback interfaces that are up.
func upInterfaces() ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	var out []string
	for _, i := range ifs {
		if i.Flags&net.FlagUp != 0 && i.Flags&net.FlagLoopback == 0 {
			out = append(out, i.Name)
		}
	}
	return out, nil
}

// tryCreate creates and removes a file in dir; it returns why that failed,
// or "" when the directory is writable.
func tryCreate(dir, nonce string) string {
	name := filepath.Join(dir, ".taskrun-probe-"+nonce)
	f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err.Error()
	}
	f.Close()
	os.Remove(name)
	return ""
}

func readFirstLimit(r *Report, paths ...string) (int64, error) {
	var errs []error
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return parseLimit(string(b))
	}
	err := errors.Join(errs...)
	r.Errors = append(r.Errors, err.Error())
	return Unknown, err
}

// probeEgress tries each egress path concurrently: connect attempts and a
// lookup only, never a payload.
func probeEgress(ctx context.Context, cfg Config) []Egress {
	out := []Egress{
		{Name: "tcp", Target: cfg.TCPTarget},
		{Name: "metadata", Target: cfg.MetadataTarget},
		{Name: "dns", Target: cfg.DNSName},
	}
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func(e *Egress) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctx, cfg.EgressTimeout)
			defer cancel()
			var err error
			if e.Name == "dns" {
				res := &net.Resolver{PreferGo: true}
				_, err = res.LookupHost(ctx, e.Target)
			} else {
				var c net.Conn
				c, err = (&net.Dialer{}).DialContext(ctx, "tcp", e.Target)
				if err == nil {
					c.Close()
				}
			}
			e.Reachable = err == nil
			if err != nil {
				e.Error = err.Error()
			}
		}(&out[i])
	}
	wg.Wait()
	return out
}

// findDockerSockets looks for unix sockets and asks each for Docker's
// GET /info. Mount targets and the well-known Docker socket paths are checked
// first, whatever their number, so a bind-mounted socket is never missed; then
// WalkRoot is walked (skipping /proc, /sys and the run dir, never following
// symlinks, at most MaxWalkEntries entries). walkErr is nil only when the walk
// covered everything it meant to.
func findDockerSockets(ctx context.Context, cfg Config, mounts []Mount) (all, docker []string, walkErr error) {
	found := map[string]bool{}
	direct := slices.Clone(wellKnownSockets)
	for _, m := range mounts {
		direct = append(direct, m.Target)
	}
	for _, p := range direct {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeSocket != 0 && !found[p] {
			found[p] = true
			all = append(all, p)
		}
	}
	seen := 0
	walkErr = filepath.WalkDir(cfg.WalkRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == cfg.WalkRoot {
				return fmt.Errorf("socket walk of %s: %w", p, err)
			}
			return nil // unreadable entries are skipped, not fatal
		}
		if d.IsDir() && (p == "/proc" || p == "/sys" || p == cfg.RunDir) {
			return filepath.SkipDir
		}
		seen++
		if seen > cfg.MaxWalkEntries {
			return errWalkBound
		}
		if d.Type()&fs.ModeSocket != 0 && !found[p] {
			found[p] = true
			all = append(all, p)
		}
		return ctx.Err()
	})
	for _, s := range all {
		if answersDocker(ctx, s, cfg.SocketTimeout) {
			docker = append(docker, s)
		}
	}
	sort.Strings(docker)
	return all, docker, walkErr
}

// reuseSockets is the socket search of a parked container's release: the
// mount targets and well-known paths checked now, the walk's findings
// taken from parked.
func reuseSockets(ctx context.Context, cfg Config, mounts []Mount, parked *Report) (all, docker []string, complete bool) {
	found := map[string]bool{}
	for _, s := range parked.UnixSockets {
		found[s] = true
		all = append(all, s)
	}
	docker = append(docker, parked.DockerSockets...)
	direct := slices.Clone(wellKnownSockets)
	for _, m := range mounts {
		direct = append(direct, m.Target)
	}
	for _, p := range direct {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeSocket != 0 && !found[p] {
			found[p] = true
			all = append(all, p)
			if answersDocker(ctx, p, cfg.SocketTimeout) {
				docker = append(docker, p)
			}
		}
	}
	sort.Strings(docker)
	return all, docker, parked.SocketSearchComplete
}

var errWalkBound = errors.New("socket walk stopped at its entry bound; sockets beyond it were not checked")

// wellKnownSockets are where Docker's socket usually lives; they are checked
// directly, so a socket in a listable-but-unreadable directory is found too.
var wellKnownSockets = []string{"/var/run/docker.sock", "/run/docker.sock"}

// answersDocker reports whether the unix socket at path serves the Docker
// Engine API (GET /info answered with an Api-Version header).
func answersDocker(ctx context.Context, path string, timeout time.Duration) bool {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: timeout}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/info", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK && resp.Header.Get("Api-Version") != ""
}
