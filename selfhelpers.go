package taskrun

import (
	"os"

	"github.com/taskrun/taskrun/helpers"
)

// A program that links this package is its own in-sandbox helpers, as the
// taskrun binary is: run under a helper's name (taskrun-probe,
// taskrun-relay, as a run mounts it), it is that helper and exits, before
// the program's own main. This is what lets a static program that uses
// only the seed API give its runs the self-check with no helpers installed
// (RunTaskInput.Helpers).
func init() {
	if code, ok := helpers.Main(os.Args); ok {
		os.Exit(code)
	}
}
