package executor

import (
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/sandbox"
)

// hookNames is the names of hooks, in order.
func hookNames(hooks []hook) []string {
	var names []string
	for _, h := range hooks {
		names = append(names, h.name())
	}
	return names
}

// The hook list a cold run walks, each concern only when the run needs
// it, with the create point after the uid and the empty run directory;
// egress, whose proxy makes the CA the container's routing names, comes
// last and takes the create ahead away.
func TestRunHooksListsEachConcernInLifecycleOrder(t *testing.T) {
	base := []string{"uid", "rundir", "dirs", "isolation", "workspace", "changes", "output", "gateway", "files"}

	hooks, createAt := runHooks(&plan{}, &workdir{})
	assert.Equal(t, base, hookNames(hooks))
	assert.Equal(t, 2, createAt, "the engine creates once the run has its uid and empty run dir")

	p := &plan{limits: limits{disk: 1 << 30}, caps: sandbox.Capabilities{Stats: true}}
	p.in.Egress = egress.Policy{Rules: []egress.Rule{{Host: "example.com"}}}
	hooks, createAt = runHooks(p, &workdir{})
	assert.Equal(t, append(slices.Clone(base), "diskwatch", "metrics", "egress"), hookNames(hooks))
	assert.Equal(t, -1, createAt, "egress takes the create ahead away")
}

// docs/architecture.md's hook table is the code's list: the same hooks in
// the same order (the warm slot's hook in place of uid, rundir and dirs),
// with the create point where runHooks puts it.
func TestArchitectureDocListsTheRunnersHooks(t *testing.T) {
	doc, err := os.ReadFile("../docs/architecture.md")
	require.NoError(t, err)
	start, end := regexp.MustCompile("(?m)^`runHooks`").FindIndex(doc), regexp.MustCompile("(?m)^The hook contract").FindIndex(doc)
	require.NotNil(t, start, "the doc introduces runHooks' list")
	require.NotNil(t, end, "the doc states the hook contract after the list")
	doc = doc[start[0]:end[0]]
	rows := regexp.MustCompile("(?m)^\\| (`([a-z]+)`|\\*create point\\*) \\|").FindAllSubmatch(doc, -1)
	var documented []string
	docCreateAt := -1
	for _, r := range rows {
		if r[2] == nil {
			docCreateAt = len(documented)
			continue
		}
		documented = append(documented, string(r[2]))
	}
	p := &plan{limits: limits{disk: 1 << 30}, caps: sandbox.Capabilities{Stats: true}}
	p.in.Egress = egress.Policy{Rules: []egress.Rule{{Host: "example.com"}}}
	all, _ := runHooks(p, &workdir{})
	_, createAt := runHooks(&plan{}, &workdir{})

	require.Contains(t, documented, "warm", "the warm slot's hook is documented")
	assert.Equal(t, hookNames(all), slices.DeleteFunc(slices.Clone(documented), func(n string) bool { return n == "warm" }))
	assert.Equal(t, createAt, docCreateAt, "the documented create point is runHooks'")
	assert.Equal(t, (&warmHook{}).name(), "warm")
}
