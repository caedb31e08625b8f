package changeset_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/changeset"
)

// sparse creates a file of size bytes at home/rel holding only head: the
// rest is a hole.
func sparse(t *testing.T, home, rel string, size int64, head string) {
	t.Helper()
	f, err := os.Create(filepath.Join(home, rel))
	require.NoError(t, err)
	_, err = f.WriteString(head)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	require.NoError(t, f.Close())
}

// Four 256 GiB sparse files (a terabyte of holes that would take the host
// minutes of CPU to hash) are listed as changed without a digest, and the
// change set is recorded.
func TestSparseFilesAreListedWithoutReadingTheirHoles(t *testing.T) {
	home := t.TempDir()
	write(t, home, "a.txt", "a\n", 0o644)
	sparse(t, home, "kept-sparse", 256<<30, "start")
	base := filepath.Join(t.TempDir(), "base")
	// A guard, not a measure: without the bound this hashes a terabyte.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, changeset.Snapshot(ctx, home, base, changeset.Options{}))

	for i := range 4 {
		sparse(t, home, "hole"+string(rune('0'+i)), 256<<30, "agent data")
	}
	write(t, home, "a.txt", "b\n", 0o644)
	var patch bytes.Buffer
	set, err := changeset.Compute(ctx, base, home, &patch)
	require.NoError(t, err)

	ch := byPath(set)
	for i := range 4 {
		c := ch["hole"+string(rune('0'+i))]
		assert.Equal(t, changeset.Added, c.Kind)
		assert.Equal(t, int64(256<<30), c.NewSize)
		assert.Empty(t, c.NewSHA256)
		assert.Contains(t, c.NotHashed, "sparse file")
		assert.Equal(t, c.NotHashed, c.Omitted)
	}
	kept := ch["kept-sparse"]
	assert.Equal(t, changeset.Modified, kept.Kind, "an unhashed file cannot be shown unchanged")
	assert.Contains(t, kept.NotHashed, "sparse file")
	assert.Equal(t, 5, set.Summary.NotHashed)
	assert.Equal(t, changeset.Modified, ch["a.txt"].Kind)
	assert.Contains(t, patch.String(), "+b\n", "the rest of the change set is intact")
	assert.NotContains(t, patch.String(), "agent data")
	assert.True(t, strings.Contains(strings.Join(set.Notes, "\n"), "not hashed"), set.Notes)
}

// Past MaxHashBytes, files are listed without a digest instead of read.
func TestHashBudgetListsTheRestUnhashed(t *testing.T) {
	home := t.TempDir()
	base := filepath.Join(t.TempDir(), "base")
	ctx := context.Background()
	lim := changeset.Limits{MaxHashBytes: 10}
	require.NoError(t, changeset.Snapshot(ctx, home, base, changeset.Options{Limits: lim}))
	write(t, home, "a", "12345678", 0o644)
	write(t, home, "b", "abcdefgh", 0o644)
	var patch bytes.Buffer
	set, err := changeset.Compute(ctx, base, home, &patch)
	require.NoError(t, err)
	ch := byPath(set)
	assert.NotEmpty(t, ch["a"].NewSHA256)
	assert.Empty(t, ch["a"].NotHashed)
	assert.Empty(t, ch["b"].NewSHA256)
	assert.Contains(t, ch["b"].NotHashed, "MaxHashBytes")
	assert.Contains(t, patch.String(), "+12345678")
	assert.NotContains(t, patch.String(), "abcdefgh")
}
