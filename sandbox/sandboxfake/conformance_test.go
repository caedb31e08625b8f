package sandboxfake_test

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/sandbox/sandboxtest"
)

// TestConformance runs the portable cases of sandboxtest; the fake declares
// no kernel confinement, OOM, runtimes or reaper, so those cases skip.
func TestConformance(t *testing.T) {
	sandboxtest.Run(t, &harness{})
}

// harness is the fake's sandboxtest.Harness. Each case gets its own
// backend; Leftovers looks at every backend the harness made.
type harness struct {
	backends []*sandboxfake.Backend
}

func (h *harness) NewBackend(*testing.T) sandbox.Backend {
	b := sandboxfake.New()
	h.backends = append(h.backends, b)
	return b
}

func (h *harness) Capabilities() sandboxtest.Capabilities {
	return sandboxtest.Capabilities{LagTolerant: true}
}

func (h *harness) Prepare(spec *sandbox.Spec, _ *sandbox.Policy) { spec.Image = "sandboxfake" }

// Command installs w's Program under a fresh name and runs that.
func (h *harness) Command(t *testing.T, b sandbox.Backend, w sandboxtest.Workload) []string {
	if w.Program == nil {
		t.Fatalf("workload %q has no Program for sandboxfake", w.Script)
	}
	name := "/bin/case-" + rand.Text()
	b.(*sandboxfake.Backend).Install(name, w.Program)
	return []string{name}
}

// BreakStart makes the backend fail every later Start.
func (h *harness) BreakStart(_ *testing.T, b sandbox.Backend, _ *sandbox.Spec) {
	b.(*sandboxfake.Backend).FailStarts(errors.New("engine refused the container"))
}

func (h *harness) Leftovers(_ context.Context, labels map[string]string) ([]string, error) {
	var ids []string
	for _, b := range h.backends {
		ids = append(ids, b.Containers(labels)...)
	}
	return ids, nil
}
