package model

import (
	"errors"
	"fmt"
)

// ErrInvalidID is wrapped by every error ValidateID returns.
var ErrInvalidID = errors.New("invalid ID")

// MaxIDLength is the longest ID ValidateID accepts.
const MaxIDLength = 128

// idRule is the rule quoted in ValidateID errors.
const idRule = "use 1-128 characters from A-Z, a-z, 0-9, '_' and '-'"

// maxQuotedID bounds how much of a bad ID is echoed back in an error.
const maxQuotedID = 40

// ValidateID checks that id (of the given kind, e.g. "user" or "run") matches
// [A-Za-z0-9_-]{1,128}, so that it can never form or escape a path. The error
// wraps ErrInvalidID and names the kind, the (truncated) value and the rule.
func ValidateID(kind, id string) error {
	if len(id) == 0 || len(id) > MaxIDLength || !isIDString(id) {
		return fmt.Errorf("%w: %s ID %q: %s", ErrInvalidID, kind, truncateID(id), idRule)
	}
	return nil
}

func isIDString(id string) bool {
	for i := 0; i < len(id); i++ {
		if !isIDByte(id[i]) {
			return false
		}
	}
	return true
}

func isIDByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	default:
		return c == '_' || c == '-'
	}
}

func truncateID(id string) string {
	if len(id) <= maxQuotedID {
		return id
	}
	return id[:maxQuotedID] + "..."
}
