// Package images holds the Dockerfiles of the images runs use and builds them
// offline: every image is FROM scratch plus static binaries, so no registry is
// ever contacted.
package images

import (
	"archive/tar"
	"debug/elf"
	"embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
)

// Image references built by this package.
const (
	// AgentRef is the default run image: the reference agent.
	AgentRef = "taskrun/agent:local"
	// TestboxRef is a static busybox image for tests and ad-hoc commands.
	TestboxRef = "taskrun/testbox:local"
	// PodHelperRef is the helper image of runs on Kubernetes: the static
	// taskrun-pod (package helpers/podhelper).
	PodHelperRef = "taskrun/podhelper:local"
)

//go:embed agent/Dockerfile testbox/Dockerfile podhelper/Dockerfile
var dockerfiles embed.FS

// ErrMissingInput reports a binary an image needs that is not on this host.
var ErrMissingInput = errors.New("image input missing")

// Definition is everything needed to build one image.
type Definition struct {
	// Ref is the tag given to the built image.
	Ref string
	// Dockerfile is the path of the Dockerfile in the embedded set.
	Dockerfile string
	// DockerfileText, when set, is the Dockerfile itself, for images defined
	// outside this package (tests).
	DockerfileText []byte
	// Files maps a name in the build context to the host file copied there.
	Files map[string]string
}

// Agent defines taskrun/agent:local from the static taskrun-agent in binDir.
func Agent(binDir string) (Definition, error) {
	bin := filepath.Join(binDir, "taskrun-agent")
	if err := RequireStatic(bin); err != nil {
		return Definition{}, fmt.Errorf("%w; build it with `make build` (CGO_ENABLED=0 go build -o bin/ ./cmd/...)", err)
	}
	return Definition{Ref: AgentRef, Dockerfile: "agent/Dockerfile", Files: map[string]string{"taskrun-agent": bin}}, nil
}

// PodHelper defines taskrun/podhelper:local from the static taskrun-pod
// in binDir.
func PodHelper(binDir string) (Definition, error) {
	bin := filepath.Join(binDir, "taskrun-pod")
	if err := RequireStatic(bin); err != nil {
		return Definition{}, fmt.Errorf("%w; build it with `make build` (CGO_ENABLED=0 go build -o bin/ ./cmd/...)", err)
	}
	return Definition{Ref: PodHelperRef, Dockerfile: "podhelper/Dockerfile", Files: map[string]string{"taskrun-pod": bin}}, nil
}

// Testbox defines taskrun/testbox:local from the host's static busybox.
func Testbox() (Definition, error) {
	bin, err := exec.LookPath("busybox")
	if err == nil {
		err = RequireStatic(bin)
	}
	if err != nil {
		return Definition{}, fmt.Errorf("%w: a static busybox is needed (%v); install it with `apt-get install busybox-static`", ErrMissingInput, err)
	}
	return Definition{Ref: TestboxRef, Dockerfile: "testbox/Dockerfile", Files: map[string]string{"busybox": bin}}, nil
}

// RequireStatic checks that path is an ELF executable with no dynamic loader,
// so it runs in an image that has no libc. The error wraps ErrMissingInput.
func RequireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrMissingInput, path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: %s is dynamically linked; rebuild it with CGO_ENABLED=0", ErrMissingInput, path)
		}
	}
	return nil
}

// WriteContext writes def's build context as a tar stream to w: the Dockerfile
// and each input file, in a stable order.
func WriteContext(def Definition, w io.Writer) error {
	dockerfile := def.DockerfileText
	if dockerfile == nil {
		var err error
		if dockerfile, err = dockerfiles.ReadFile(def.Dockerfile); err != nil {
			return fmt.Errorf("embedded dockerfile %s: %w", def.Dockerfile, err)
		}
	}
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(dockerfile))}); err != nil {
		return err
	}
	if _, err := tw.Write(dockerfile); err != nil {
		return err
	}
	names := make([]string, 0, len(def.Files))
	for name := range def.Files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := addFile(tw, path.Clean(name), def.Files[name]); err != nil {
			return err
		}
	}
	return tw.Close()
}

func addFile(tw *tar.Writer, name, hostPath string) error {
	f, err := os.Open(hostPath)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrMissingInput, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file", ErrMissingInput, hostPath)
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: info.Size(), ModTime: info.ModTime()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}
