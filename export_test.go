package taskrun

import (
	"testing"

	"github.com/taskrun/taskrun/helpers"
)

// SetFindHelpers replaces how a run that names no helpers finds them
// (helpers.FromExecutable) until the test ends.
func SetFindHelpers(t testing.TB, find func(cacheDir string) (helpers.Files, error)) {
	old := findHelpers
	findHelpers = find
	t.Cleanup(func() { findHelpers = old })
}
