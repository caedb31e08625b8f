package taskruntest_test

import (
	"context"
	"fmt"
	"os"

	"github.com/taskrun/taskrun/integration/taskruntest"
)

// A run of a local image under taskrun's policy, read back as the control
// plane and the blob store saw it. In a test, taskruntest.Run(ctx, t, opts)
// does the same with t.TempDir() and t.Cleanup.
func ExampleEnv_Run() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "taskruntest-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	env, err := taskruntest.NewEnv(ctx, dir)
	if err != nil {
		panic(err)
	}
	defer env.Close(ctx)

	res, err := env.Run(ctx, taskruntest.Options{
		Image: testboxImage, // any local image; this one is a static busybox
		RunID: "example",
		Cmd:   []string{"sh", "-c", `echo "hello from $TASKRUN_RUN_ID"; echo done > /taskrun/artifacts/report.txt`},
	})
	if err != nil {
		panic(err)
	}
	report, err := res.Artifact(ctx, "report.txt")
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status, res.ExitCode)
	fmt.Print(string(res.Stream))
	fmt.Print(string(report))
	// Output:
	// SUCCEEDED 0
	// hello from example
	// done
}
