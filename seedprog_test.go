package taskrun_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// seedModuleCeiling bounds the modules in `go list -m all` of a program
// that uses only the seed API (testdata/seedprog), so the count can only
// go down. It is 191 today: the module requires everything its go.mod
// lists, the Kubernetes client, the AWS SDK and testcontainers included,
// for the packages that use them. The goal is under 120, which needs those
// packages in modules of their own and the Docker client's split modules
// (github.com/moby/moby/client) in place of github.com/docker/docker,
// whose go.mod-less release brings its own tests' dependencies (gRPC,
// OpenTelemetry exporters).
const seedModuleCeiling = 191

// seedForbidden are the packages a seed-API program must not link: cloud
// SDKs and store drivers (linked only by programs that import them), the
// Kubernetes client, gRPC, the control plane's databases and the test
// frameworks.
var seedForbidden = []string{
	"github.com/aws/", "gocloud.dev/", "cloud.google.com/", "github.com/Azure/azure-sdk",
	"k8s.io/", "sigs.k8s.io/", "google.golang.org/grpc", "google.golang.org/api",
	"github.com/jackc/", "modernc.org/", "github.com/testcontainers/",
	"github.com/taskrun/taskrun/persist/s3", "github.com/taskrun/taskrun/sandbox/kubernetes",
}

// A program that uses only the seed API, in a module of its own that
// requires this checkout through a replace, builds, links no cloud SDK,
// Kubernetes client or database driver, and has at most seedModuleCeiling
// modules. Offline: the module cache must hold the checkout's modules (any
// build of it fetches them).
func TestSeedProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	gotool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command builds the seed program")
	checkout, err := os.Getwd()
	require.NoError(t, err)
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("testdata", "seedprog", "main.go"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), src, 0o644))
	mod := "module example.com/seedprog\n\ngo 1.26.0\n\nrequire github.com/taskrun/taskrun v0.0.0\n\nreplace github.com/taskrun/taskrun => " + checkout + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644))
	sum, err := os.ReadFile("go.sum")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))
	gocmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(gotool, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=mod")
		out, err := cmd.Output()
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		require.NoError(t, err, "go %s", strings.Join(args, " "))
		return string(out)
	}

	deps := strings.Fields(gocmd("list", "-deps", "."))
	require.Contains(t, deps, "github.com/taskrun/taskrun", "the listing holds the program's packages")
	for _, p := range deps {
		for _, bad := range seedForbidden {
			assert.False(t, strings.HasPrefix(p, bad), "the seed program links %s", p)
		}
	}
	gocmd("build", "-o", filepath.Join(dir, "seedprog"), ".")
	modules := strings.Split(strings.TrimSpace(gocmd("list", "-m", "all")), "\n")
	t.Logf("the seed program links %d packages from a graph of %d modules", len(deps), len(modules))
	assert.LessOrEqual(t, len(modules), seedModuleCeiling, "modules in the seed program's go list -m all")
}
