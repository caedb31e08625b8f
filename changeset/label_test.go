package changeset_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/changeset"
)

// TestImageExcludes: the image label's patterns, separated by commas or
// white space, follow the run's excludes (the defaults when it gave none);
// a label whose pattern does not parse is refused.
func TestImageExcludes(t *testing.T) {
	got, err := changeset.ImageExcludes(map[string]string{changeset.LabelExclude: " .cache, .npm\n**/__pycache__ .taskrun-agent"})
	require.NoError(t, err)
	assert.Equal(t, []string{".cache", ".npm", "**/__pycache__", ".taskrun-agent"}, got)
	none, err := changeset.ImageExcludes(map[string]string{"other": "x"})
	require.NoError(t, err)
	assert.Nil(t, none)

	assert.Equal(t, []string{".taskrun-agent", ".cache", ".npm", "**/__pycache__"}, changeset.WithImageExcludes(nil, got))
	assert.Equal(t, []string{"build", ".cache"}, changeset.WithImageExcludes([]string{"build"}, []string{".cache"}))
	assert.Nil(t, changeset.WithImageExcludes(nil, nil), "no label: the run's excludes as they are")

	_, err = changeset.ImageExcludes(map[string]string{changeset.LabelExclude: "a/[b"})
	assert.Error(t, err)
}
