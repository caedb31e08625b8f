// Package testbin gives tests the static in-sandbox helpers (taskrun-probe,
// taskrun-relay, taskrun-agent): the ones `make build` put in TASKRUN_BIN_DIR,
// or, without it, ones built once per test process. Program builds the
// static test workloads kept under internal/testbin (such as kernelcalls).
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// EnvBinDir names the directory holding prebuilt static helpers.
const EnvBinDir = "TASKRUN_BIN_DIR"

var (
	once sync.Once
	dir  string
	err  error
)

// Dir returns a directory, readable and executable by the sandbox user,
// holding the static helpers. The directory lives for the whole test process.
func Dir(t testing.TB) string {
	t.Helper()
	once.Do(func() { dir, err = locate() })
	if err != nil {
		t.Fatalf("static helpers: %v", err)
	}
	return dir
}

func locate() (string, error) {
	if d := os.Getenv(EnvBinDir); d != "" {
		return d, nil
	}
	d := filepath.Join(os.TempDir(), fmt.Sprintf("taskrun-testbin-%d", os.Getpid()))
	if err := os.MkdirAll(d, 0o755); err != nil {
		return "", err
	}
	// The sandbox user (uid 10001) executes the helpers from here.
	if err := os.Chmod(d, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", d+"/", "./cmd/taskrun-probe", "./cmd/taskrun-relay", "./cmd/taskrun-agent")
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w: %s", err, out)
	}
	return d, nil
}

// Cleanup removes helpers and programs built for this process; call it from
// TestMain.
func Cleanup() {
	if dir != "" && os.Getenv(EnvBinDir) == "" {
		os.RemoveAll(dir)
	}
	programsMu.Lock()
	defer programsMu.Unlock()
	if programsDir != "" {
		os.RemoveAll(programsDir)
	}
}

var (
	programsMu  sync.Mutex
	programsDir string
	programs    = map[string]string{}
)

// Program returns the path of a static program built from pkg, a package
// path relative to the module root such as "./internal/testbin/kernelcalls".
// It is built once per test process, in a directory every sandbox user can
// read and execute.
func Program(t testing.TB, pkg string) string {
	t.Helper()
	programsMu.Lock()
	defer programsMu.Unlock()
	if p, ok := programs[pkg]; ok {
		return p
	}
	if programsDir == "" {
		d, err := os.MkdirTemp("", "taskrun-testprog-")
		if err == nil {
			err = os.Chmod(d, 0o755)
		}
		if err != nil {
			t.Fatalf("test programs: %v", err)
		}
		programsDir = d
	}
	out := filepath.Join(programsDir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v: %s", pkg, err, b)
	}
	programs[pkg] = out
	return out
}

// moduleRoot is the repository root, found from this source file.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
