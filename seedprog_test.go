package taskrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/uidpool"
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

// seedModule writes testdata/seedprog as a module of its own that requires
// this checkout through a replace, and returns its directory and a runner
// of the go command there (with extra environment variables). Offline:
// the module cache must hold the checkout's modules (any build of it
// fetches them).
func seedModule(t *testing.T) (string, func(env []string, args ...string) string) {
	t.Helper()
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
	return dir, func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command(gotool, args...)
		cmd.Dir = dir
		cmd.Env = append(append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=mod"), env...)
		out, err := cmd.Output()
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		require.NoError(t, err, "go %s", strings.Join(args, " "))
		return string(out)
	}
}

// A program that uses only the seed API, in a module of its own that
// requires this checkout through a replace, builds, links no cloud SDK,
// Kubernetes client or database driver, and has at most seedModuleCeiling
// modules.
func TestSeedProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	dir, gocmd := seedModule(t)
	deps := strings.Fields(gocmd(nil, "list", "-deps", "."))
	require.Contains(t, deps, "github.com/taskrun/taskrun", "the listing holds the program's packages")
	for _, p := range deps {
		for _, bad := range seedForbidden {
			assert.False(t, strings.HasPrefix(p, bad), "the seed program links %s", p)
		}
	}
	gocmd(nil, "build", "-o", filepath.Join(dir, "seedprog"), ".")
	modules := strings.Split(strings.TrimSpace(gocmd(nil, "list", "-m", "all")), "\n")
	t.Logf("the seed program links %d packages from a graph of %d modules", len(deps), len(modules))
	assert.LessOrEqual(t, len(modules), seedModuleCeiling, "modules in the seed program's go list -m all")
}

// seedRun runs the seed program bin on the real engine with a fresh runs
// root and store: a run of cmd in the test image. It returns the
// program's combined output, the runs root, the store and the program's
// error.
func seedRun(t *testing.T, bin string, cmd ...string) (string, string, *persist.Store, error) {
	t.Helper()
	root, storeDir := t.TempDir(), t.TempDir()
	runDir := taskrun.NewRuntimePathsFromRoot(root).RuntimeTaskRunDir("u1", "c1", "t1", "r1")
	t.Cleanup(func() {
		ctx := context.Background()
		left, err := runtest.ListContainers(ctx, map[string]string{sandbox.LabelRunDir: runDir})
		assert.NoError(t, err)
		assert.Empty(t, left, "the seed program's run left its container")
		assert.NoError(t, runtest.RemoveContainers(ctx, map[string]string{sandbox.LabelRunDir: runDir}))
	})
	ctx, cancel := context.WithTimeout(context.Background(), testdeadline.Scale(3*time.Minute))
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{root, storeDir, testImage}, cmd...)...).CombinedOutput()
	store, serr := persist.Open(context.Background(), "file://"+storeDir)
	require.NoError(t, serr)
	t.Cleanup(func() { _ = store.Close() })
	return string(out), root, store, err
}

// seedRef is the seed program's run.
var seedRef = persist.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"}

// A static program that uses only the seed API, with none of the fields
// the seed lacked, runs its task as `taskrun run` does: as a host uid of
// its own from the uid pool, and behind the in-sandbox self-check, the
// program itself serving as taskrun-probe. Both show in the run's
// isolation record.
//
// Protection: RunTaskInput's defaults (a uid pool; the running program as
// its helpers, which the root package's init makes it). Without them the
// record has no self-check report and the agent runs as uid 10001, which
// fails this test.
func TestSeedProgramRunsOnAUIDOfItsOwnBehindTheSelfCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program and runs a container")
	}
	if os.Geteuid() != 0 {
		t.Skip("a uid per run needs root: the run directory is chowned to it")
	}
	dir, gocmd := seedModule(t)
	bin := filepath.Join(dir, "seedprog")
	gocmd([]string{"CGO_ENABLED=0"}, "build", "-o", bin, ".")

	out, _, store, err := seedRun(t, bin, "sh", "-c", "id -u")
	require.NoError(t, err, "the run succeeds: %s", out)
	rc, err := store.OpenRunFile(context.Background(), seedRef, taskrun.AuditRecordName)
	require.NoError(t, err)
	var record audit.Record
	require.NoError(t, json.NewDecoder(rc).Decode(&record))
	_ = rc.Close()
	require.NotNil(t, record.Probe, "the self-check reported from inside the sandbox")
	assert.Empty(t, record.ProbeContradictions)
	uid := record.Probe.UID
	assert.NotEqual(t, 10001, uid, "not the uid every run shares")
	r := uidpool.DefaultRange()
	assert.True(t, uid >= r.First && uid <= r.Last, "uid %d is from the pool's range %s", uid, r)
	rc, err = store.OpenRunFile(context.Background(), seedRef, taskrun.OutputLogName)
	require.NoError(t, err)
	agent, err := io.ReadAll(rc)
	_ = rc.Close()
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(uid)+"\n", string(agent), "the agent ran as the uid the self-check saw")
}

// A seed-API program that cannot serve as its own helpers (dynamically
// linked) and names none has its run refused before anything of the run
// is made, reported FAILED with a reason that names the fixes: the
// self-check is never skipped silently.
func TestSeedProgramWithoutHelpersIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	dir, gocmd := seedModule(t)
	cc := strings.Fields(gocmd(nil, "env", "CC"))
	if len(cc) == 0 {
		t.Skip("no C compiler configured for cgo (go env CC), so no dynamic program to refuse")
	}
	if _, err := exec.LookPath(cc[0]); err != nil {
		t.Skipf("no C compiler for cgo (%s), so no dynamic program to refuse", cc[0])
	}
	bin := filepath.Join(dir, "seedprog")
	gocmd([]string{"CGO_ENABLED=1"}, "build", "-o", bin, ".")
	if helpers.CheckStatic(bin) == nil {
		t.Skip("the toolchain linked the program statically (no C toolchain for cgo)")
	}

	out, root, _, err := seedRun(t, bin, "true")
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "the program fails: %s", out)
	assert.Contains(t, out, `"status":"FAILED"`, "reported FAILED")
	for _, fix := range []string{"not statically linked", "HelpersDir", "CGO_ENABLED=0", "NoSelfCheck"} {
		assert.Contains(t, out, fix)
	}
	assert.NoDirExists(t, filepath.Join(root, "users"), "no run directory, so no container")
}
