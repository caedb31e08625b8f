package taskruntest_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/taskrun/taskrun/images"
	"github.com/taskrun/taskrun/integration/taskruntest"
)

// testboxImage is a per-session build of taskrun's busybox image
// (images.Testbox), removed when the tests end.
var testboxImage string

// testboxEnv hands a parent's testbox build to a child test process.
const testboxEnv = "TASKRUNTEST_TESTBOX_IMAGE"

func TestMain(m *testing.M) {
	// No registry is reachable, so testcontainers' reaper image cannot be
	// pulled; the suite cleans up after itself instead.
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	flag.Parse()
	if testing.Short() {
		fmt.Println("taskruntest: every test runs containers; skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	// Runs start behind the self-check: its static helpers come from
	// TASKRUN_BIN_DIR (`make build`'s bin/), else are built here.
	if os.Getenv(taskruntest.HelpersDirEnv) == "" {
		dir, err := buildHelpers(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "taskruntest:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		os.Setenv(taskruntest.HelpersDirEnv, dir)
	}
	if ref := os.Getenv(testboxEnv); ref != "" {
		testboxImage = ref
		return m.Run()
	}
	def, err := images.Testbox()
	if err != nil {
		fmt.Fprintln(os.Stderr, "taskruntest:", err)
		return 1
	}
	img, err := taskruntest.BuildDefinition(ctx, "taskruntest/testbox", def)
	if err != nil {
		fmt.Fprintln(os.Stderr, "taskruntest:", err)
		return 1
	}
	testboxImage = img.Ref
	code := m.Run()
	if err := img.Remove(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "taskruntest:", err)
		code = 1
	}
	return code
}

// buildHelpers builds the static taskrun-probe and taskrun-relay into a new
// directory the sandbox's uids may read.
func buildHelpers(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp("", "taskruntest-helpers-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	for _, pkg := range []string{"github.com/taskrun/taskrun/cmd/taskrun-probe", "github.com/taskrun/taskrun/cmd/taskrun-relay"} {
		if _, err := taskruntest.BuildStatic(ctx, dir, pkg); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}
