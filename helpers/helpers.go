// Package helpers is the executor's in-sandbox helpers: the self-check
// (taskrun-probe, package probe) and the model relay (taskrun-relay, package
// relay).
//
// The taskrun binary carries both and acts as one when it is run under its
// name (Main), so a lone taskrun binary is all a host needs. Each run mounts
// exactly the helper files, read-only and file by file, at fixed paths under
// Dir; nothing else of the host's directories is visible. FromExecutable
// prepares the helpers installed with the running taskrun binary: the
// separately built taskrun-probe and taskrun-relay of the same build beside
// it (`make build` puts them there), which start in a fraction of the
// binary's time because they link none of the executor, or else the binary
// itself. Each must be static, and is copied once into a private cache
// directory, so the mount never exposes the directory taskrun is installed
// in (often /usr/local/bin) and an upgrade of the installed files never
// changes what live runs see. FromDir uses a directory of separately built
// static helpers as it is.
package helpers

import (
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/taskrun/taskrun/helpers/podhelper"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/probe"
	"github.com/taskrun/taskrun/relay"
	"github.com/taskrun/taskrun/sandbox"
)

// In-container names and paths of the helpers.
const (
	// Dir is the read-only directory of the helpers inside the container.
	Dir = model.ContainerHelpersDir
	// ProbeName is the self-check's program name.
	ProbeName = "taskrun-probe"
	// RelayName is the model relay's program name.
	RelayName = "taskrun-relay"
	// ProbePath is where the self-check is inside the container.
	ProbePath = Dir + "/" + ProbeName
	// RelayPath is where the relay is inside the container: an agent runs
	// `/.taskrun/bin/taskrun-relay -- CMD` to reach the model gateway over
	// loopback TCP.
	RelayPath = Dir + "/" + RelayName
)

// Names lists every helper, in mount order.
var Names = []string{ProbeName, RelayName}

// Main runs the helper that argv[0] names (by its base name) and returns its
// exit status; ok is false when argv[0] names no helper. The self-check does
// not return when it starts the command it wraps.
func Main(argv []string) (code int, ok bool) {
	if len(argv) == 0 {
		return 0, false
	}
	switch filepath.Base(argv[0]) {
	case ProbeName:
		return probe.Main(argv[1:]), true
	case RelayName:
		return relay.Main(argv[1:]), true
	case podhelper.Name:
		return podhelper.Main(argv[1:]), true
	}
	return 0, false
}

// ErrNotStatic is wrapped when a helper executable is dynamically linked: it
// would not run in an image without its loader and libraries.
var ErrNotStatic = errors.New("not statically linked")

// Files maps each helper's name to the host file mounted for it.
type Files map[string]string

// Mounts returns the read-only bind mounts of the helpers, one per file, at
// Dir/<name>, in the order of Names.
func (f Files) Mounts() []sandbox.Mount {
	var out []sandbox.Mount
	for _, name := range Names {
		if src, ok := f[name]; ok {
			out = append(out, sandbox.Mount{Source: src, Target: Dir + "/" + name, ReadOnly: true})
		}
	}
	return out
}

// Sources maps each in-container helper path to its host file, the pin the
// audit checks helper mounts against.
func (f Files) Sources() map[string]string {
	out := make(map[string]string, len(f))
	for name, src := range f {
		out[Dir+"/"+name] = src
	}
	return out
}

// FromDir returns the helpers found in dir, a directory of separately built
// static helpers: taskrun-probe is required, taskrun-relay optional.
func FromDir(dir string) (Files, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("helpers dir %s: %w", dir, err)
	}
	files := Files{}
	for _, name := range Names {
		p := filepath.Join(abs, name)
		info, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) && name != ProbeName {
			continue
		}
		if err == nil && !info.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
		if err == nil {
			err = CheckStatic(p)
		}
		if err != nil {
			return nil, fmt.Errorf("helper %s: %w; build the helpers with `CGO_ENABLED=0 make build`, or leave the helpers dir unset to use the taskrun binary itself", p, err)
		}
		files[name] = p
	}
	return files, nil
}

// selfExe is the running executable, as the kernel sees it even after the
// installed file was replaced.
const selfExe = "/proc/self/exe"

// FromExecutable returns the helpers installed with the running taskrun
// binary, each copied once per content to cacheDir/<sha256>/<name> (created
// 0755, the file 0555), which is what the runs mount. A helper is the
// separately built program of its name beside the installed binary when that
// is static and of the same build (SameBuild); otherwise it is the binary
// itself, which then must be static.
func FromExecutable(cacheDir string) (Files, error) {
	var dir string // unknown: the binary serves every helper
	if installed, err := os.Executable(); err == nil {
		dir = filepath.Dir(installed)
	}
	return fromExecutable(selfExe, dir, cacheDir)
}

// fromExecutable is FromExecutable for the executable exe, installed in dir
// ("" to use exe alone).
func fromExecutable(exe, dir, cacheDir string) (Files, error) {
	var build *debug.BuildInfo
	if dir != "" {
		build, _ = buildinfo.ReadFile(exe) // nil: exe serves every helper
	}
	files := Files{}
	var self string
	for _, name := range Names {
		if p := filepath.Join(dir, name); build != nil && installedWith(p, build) {
			path, err := cachedCopy(p, name, cacheDir)
			if err != nil {
				return nil, fmt.Errorf("helpers cache %s: %w", cacheDir, err)
			}
			files[name] = path
			continue
		}
		if self == "" {
			if err := CheckStatic(exe); err != nil {
				name, _ := os.Executable()
				return nil, fmt.Errorf("taskrun binary %s is the in-sandbox helper and must run in any image: %w; build it with CGO_ENABLED=0 (`make build` does), or pass a helpers dir of static taskrun-probe and taskrun-relay", name, err)
			}
			path, err := cachedCopy(exe, "taskrun", cacheDir)
			if err != nil {
				return nil, fmt.Errorf("helpers cache %s: %w", cacheDir, err)
			}
			self = path
		}
		files[name] = self
	}
	return files, nil
}

// installedWith reports whether the file at path is a static program of the
// build described by build: a helper installed with that executable.
func installedWith(path string, build *debug.BuildInfo) bool {
	if info, err := os.Stat(path); err != nil || !info.Mode().IsRegular() || CheckStatic(path) != nil {
		return false
	}
	helper, err := buildinfo.ReadFile(path)
	return err == nil && SameBuild(helper, build)
}

// buildKeys are the build settings two programs of one build share.
var buildKeys = []string{"-ldflags", "-tags", "-trimpath", "CGO_ENABLED", "GOARCH", "GOOS", "vcs.revision", "vcs.time", "vcs.modified"}

// SameBuild reports whether two programs could come from one build of this
// module: the same toolchain, module version and sum, build settings
// (flags, platform and, where stamped, the source revision), and the same
// version of every dependency both link. It tells an upgraded binary from
// helpers left by an older release; two builds of one unstamped source tree
// ("(devel)", or GOFLAGS=-buildvcs=false) look the same, so build the
// helpers with the binary, as `make build` does.
func SameBuild(a, b *debug.BuildInfo) bool {
	if a.GoVersion != b.GoVersion || a.Main.Path != b.Main.Path || a.Main.Version != b.Main.Version || a.Main.Sum != b.Main.Sum {
		return false
	}
	for _, k := range buildKeys {
		if setting(a, k) != setting(b, k) {
			return false
		}
	}
	deps := make(map[string]debug.Module, len(b.Deps))
	for _, d := range b.Deps {
		deps[d.Path] = *d
	}
	for _, d := range a.Deps {
		if o, ok := deps[d.Path]; ok && (o.Version != d.Version || o.Sum != d.Sum) {
			return false
		}
	}
	return true
}

// setting is the value of a build setting, "" when unset.
func setting(bi *debug.BuildInfo, key string) string {
	for _, s := range bi.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

// cachedCopy is cacheCopy without reading and hashing the binary (tens of
// MB) on every run: a stamp named after exe's identity (device, inode,
// size, modification and change times) records which copy holds its
// content and that copy's own identity. The stamp is trusted only while
// both identities are unchanged; the change time cannot be set back by any
// write or chmod, so a copy altered since it was stamped, or a rebuilt
// binary, takes the full path again.
func cachedCopy(exe, name, cacheDir string) (string, error) {
	id, err := identity(exe)
	if err != nil {
		return "", err
	}
	stamp := filepath.Join(cacheDir, "stamps", id)
	if data, err := os.ReadFile(stamp); err == nil {
		dst, want, ok := strings.Cut(string(data), "\n")
		if have, err := identity(dst); ok && err == nil && have == want && filepath.Dir(filepath.Dir(dst)) == filepath.Clean(cacheDir) {
			return dst, nil
		}
	}
	dst, err := cacheCopy(exe, name, cacheDir)
	if err != nil {
		return "", err
	}
	// A stamp that cannot be written only costs the next run the hash.
	if dstID, err := identity(dst); err == nil {
		_ = writeStamp(stamp, dst+"\n"+dstID)
	}
	return dst, nil
}

// identity names a file's identity: device, inode, size, modification and
// change times.
func identity(path string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d-%d-%d-%d.%d-%d.%d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec), nil
}

// writeStamp writes a stamp atomically.
func writeStamp(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".stamp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(content)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// cacheCopy copies exe to cacheDir/<sha256>/name unless that file is there
// already with exactly exe's content.
func cacheCopy(exe, name, cacheDir string) (string, error) {
	data, err := os.ReadFile(exe)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	dir := filepath.Join(cacheDir, hex.EncodeToString(sum[:]))
	dst := filepath.Join(dir, name)
	if have, err := os.ReadFile(dst); err == nil && sha256.Sum256(have) == sum {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(0o555)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	return dst, nil
}

// CheckStatic returns an error wrapping ErrNotStatic when the ELF file at
// path asks for a program interpreter (PT_INTERP): it is dynamically linked.
func CheckStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("read ELF: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp, _ := io.ReadAll(io.LimitReader(p.Open(), 256))
			return fmt.Errorf("%w: it needs the loader %s", ErrNotStatic, string(trimNUL(interp)))
		}
	}
	return nil
}

func trimNUL(b []byte) []byte {
	if i := slices.Index(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}
