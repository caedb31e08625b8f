package persist

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestOpenWithoutTheDriverNamesItsPackage opens s3:// in a program that
// has not registered the driver (this test binary links it through s3test,
// so the test unregisters it for its duration): the error names the import
// that fixes it.
func TestOpenWithoutTheDriverNamesItsPackage(t *testing.T) {
	driversMu.Lock()
	saved, had := drivers["s3"]
	delete(drivers, "s3")
	driversMu.Unlock()
	t.Cleanup(func() {
		if had {
			driversMu.Lock()
			drivers["s3"] = saved
			driversMu.Unlock()
		}
	})
	_, err := Open(t.Context(), "s3://bucket?region=us-east-1")
	assert.ErrorContains(t, err, `import _ "github.com/taskrun/taskrun/persist/s3"`)
}
