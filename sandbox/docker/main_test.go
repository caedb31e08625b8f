package docker

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/taskrun/taskrun/internal/registrytest"
)

// The package's one registry, started by the first test that needs it and
// stopped after the last test.
var (
	registryOnce   sync.Once
	sharedRegistry *registrytest.Registry
	registryErr    error
)

// testRegistry returns the package's registry; without the registry binary
// the test is skipped, or fails when registrytest.Required().
func testRegistry(t *testing.T) *registrytest.Registry {
	t.Helper()
	registryOnce.Do(func() { sharedRegistry, registryErr = registrytest.Start(context.Background()) })
	if errors.Is(registryErr, registrytest.ErrNoBinary) && !registrytest.Required() {
		t.Skip(registryErr)
	}
	if registryErr != nil {
		t.Fatal(registryErr)
	}
	return sharedRegistry
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedRegistry != nil {
		sharedRegistry.Close()
	}
	os.Exit(code)
}
