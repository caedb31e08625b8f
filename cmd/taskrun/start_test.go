package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// initialisedPackages runs the taskrun binary with args under
// GODEBUG=inittrace=1 and returns the packages whose initialisation the
// runtime traced, in order.
func initialisedPackages(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command(taskrunBin(t), args...)
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &bytes.Buffer{}, &stderr
	require.NoError(t, cmd.Run(), "taskrun %v: %s", args, stderr.String())
	var pkgs []string
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 2 && f[0] == "init" {
			pkgs = append(pkgs, f[1])
		}
	}
	require.NoError(t, sc.Err())
	return pkgs
}

// TestStartInitialisesNoKubernetesScheme checks what every command pays at
// start: the Kubernetes backend is linked, but not client-go's clientset,
// whose scheme registers every API group of Kubernetes at package init. Only
// the three API groups the backend uses (core/v1, networking/v1, and
// coordination/v1 for each run's Lease) initialise.
func TestStartInitialisesNoKubernetesScheme(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the taskrun binary")
	}
	for _, args := range [][]string{{"version"}, {"run", "--help"}} {
		pkgs := initialisedPackages(t, args...)
		require.Contains(t, pkgs, "runtime", "the trace should list the initialised packages")
		require.Contains(t, pkgs, "k8s.io/api/core/v1", "the Kubernetes backend should be linked")
		for _, p := range pkgs {
			assert.NotEqual(t, "k8s.io/client-go/kubernetes/scheme", p, "taskrun %v initialises client-go's scheme of every API group", args)
			assert.False(t, strings.HasPrefix(p, "sigs.k8s.io/structured-merge-diff/v6/typed"), "taskrun %v initialises %s", args, p)
			if g, ok := strings.CutPrefix(p, "k8s.io/api/"); ok {
				assert.Contains(t, []string{"core/v1", "networking/v1", "coordination/v1"}, g, "taskrun %v initialises the API group %s", args, p)
			}
		}
	}
}

// TestBinaryLinksTheS3Driver checks that the binary opens s3:// stores:
// package persist links no driver of its own, main imports persist/s3.
func TestBinaryLinksTheS3Driver(t *testing.T) {
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the binary's dependencies")
	}
	out, err := exec.Command(gotool, "list", "-deps", ".").Output()
	require.NoError(t, err)
	assert.Contains(t, strings.Fields(string(out)), "github.com/taskrun/taskrun/persist/s3")
}
