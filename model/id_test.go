package model_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
)

func TestValidateID(t *testing.T) {
	tests := []struct {
		name string
		id   string
		ok   bool
	}{
		{"empty", "", false},
		{"slash", "a/b", false},
		{"dotdot", "..", false},
		{"dotdot prefix", "../x", false},
		{"dot", ".", false},
		{"129 chars", strings.Repeat("a", 129), false},
		{"unicode", "usér", false},
		{"space", "a b", false},
		{"nul", "a\x00b", false},
		{"backslash", `a\b`, false},
		{"single char", "a", true},
		{"128 chars", strings.Repeat("Z", 128), true},
		{"mixed", "user_01-ABC", true},
		{"uuid", "3f2c1e9a-7b4d-4c1a-9e8f-0123456789ab", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := model.ValidateID("task", tt.id)
			if tt.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, model.ErrInvalidID)
			assert.Contains(t, err.Error(), "task ID")
			assert.Contains(t, err.Error(), "A-Z, a-z, 0-9")
		})
	}
}

func TestValidateIDTruncatesLongValues(t *testing.T) {
	id := strings.Repeat("x", 60) + "/" + strings.Repeat("y", 500)
	err := model.ValidateID("run", id)
	require.ErrorIs(t, err, model.ErrInvalidID)
	assert.Contains(t, err.Error(), `"`+strings.Repeat("x", 40)+`..."`)
	assert.Less(t, len(err.Error()), 200)
}
