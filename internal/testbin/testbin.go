// Package testbin gives tests the static in-sandbox helpers (taskrun-probe,
// taskrun-relay, taskrun-agent): the ones `make build` put in TASKRUN_BIN_DIR,
// or, without it, ones built once per test process.
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

// Cleanup removes helpers built for this process; call it from TestMain.
func Cleanup() {
	if dir != "" && os.Getenv(EnvBinDir) == "" {
		os.RemoveAll(dir)
	}
}

// moduleRoot is the repository root, found from this source file.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
