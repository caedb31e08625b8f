package audit

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEveryRuleSaysWhatItProtectsAgainst(t *testing.T) {
	infos := Rules()
	require.Len(t, infos, len(RuleIDs()))
	for i, info := range infos {
		assert.Equal(t, RuleIDs()[i], info.ID)
		assert.NotEmpty(t, info.Protects, "rule %s has no protection text", info.ID)
		assert.NotEmpty(t, info.Title, "rule %s", info.ID)
	}
	ids := map[string]bool{}
	for _, id := range RuleIDs() {
		ids[id] = true
	}
	for id := range protections {
		assert.True(t, ids[id], "protection text for unknown rule %s", id)
	}
}
